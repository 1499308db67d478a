// Package servetest opens agent-sandbox's own Go client on a kosa8 serve
// without a Kubernetes API server: a fake one answers the client's
// SandboxClaim with a Ready Sandbox, then the client speaks the runtime
// contract to the URL given, as it would through the sandbox-router. For
// tests only.
package servetest

import (
	"context"
	"net/http"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	sandboxv1beta1 "sigs.k8s.io/agent-sandbox/api/v1beta1"
	asb "sigs.k8s.io/agent-sandbox/clients/go/sandbox"
	agentsfake "sigs.k8s.io/agent-sandbox/clients/k8s/clientset/versioned/fake"
	extfake "sigs.k8s.io/agent-sandbox/clients/k8s/extensions/clientset/versioned/fake"
	extv1beta1 "sigs.k8s.io/agent-sandbox/extensions/api/v1beta1"
)

// TokenTransport adds the token as a caller behind the sandbox-router
// does: in X-Kosa8-Token (the router strips Authorization).
type TokenTransport struct{ Token string }

func (tt TokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if tt.Token != "" {
		r.Header.Set("X-Kosa8-Token", tt.Token)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// Open opens the client on url the way a user's program does (a
// SandboxClaim of a warm pool, the Sandbox it names waited on until
// Ready, then the runtime's API), the claim answered with the sandbox
// sbName.
func Open(t testing.TB, url, sbName, token string) *asb.Sandbox {
	t.Helper()
	ctx := context.Background()
	ready := &sandboxv1beta1.Sandbox{
		ObjectMeta: metav1.ObjectMeta{Name: sbName, Namespace: "default"},
		Status: sandboxv1beta1.SandboxStatus{
			PodIPs: []string{"10.0.0.7"},
			Conditions: []metav1.Condition{{
				Type: string(sandboxv1beta1.SandboxConditionReady), Status: metav1.ConditionTrue,
				Reason: sandboxv1beta1.SandboxReasonDependenciesReady, LastTransitionTime: metav1.Now(),
			}},
		},
	}
	// Made through the client, not given to NewSimpleClientset: its
	// tracker files a given object under a resource the client does not
	// list (seen with v1.0.1's generated fake).
	agents := agentsfake.NewSimpleClientset()
	if _, err := agents.AgentsV1beta1().Sandboxes("default").Create(ctx, ready, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ext := extfake.NewSimpleClientset()
	ext.PrependReactor("create", "sandboxclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		claim := a.(k8stesting.CreateAction).GetObject().(*extv1beta1.SandboxClaim)
		claim.Name = claim.GenerateName + "1"
		claim.Status.SandboxStatus.Name = sbName // what the claim controller writes
		return false, nil, nil
	})
	sb, err := asb.New(ctx, asb.Options{
		WarmPoolName: "kosa8", APIURL: url, Quiet: true,
		HTTPTransport:  TokenTransport{token},
		K8sHelper:      &asb.K8sHelper{AgentsClient: agents.AgentsV1beta1(), ExtensionsClient: ext.ExtensionsV1beta1()},
		RequestTimeout: 120 * time.Second, PerAttemptTimeout: 60 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Open(ctx); err != nil {
		t.Fatalf("open through agent-sandbox's client: %v", err)
	}
	return sb
}
