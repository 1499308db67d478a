// Package k8s runs kosa8 under a real Kubernetes control plane: a
// kube-apiserver built from k8s.io/kubernetes over kine (SQLite),
// agent-sandbox's CRDs, controller and sandbox-router (its Go module), and
// kosa8's manifests of deploy/kubernetes applied to it. No kubelet runs
// here (see docs/kubernetes.md): the test plays it, running each pod's
// container command on the host with the pod's environment, its volumes
// as folders and its port as a host port, and reporting the pod's status
// to the API server as a kubelet does. agent-sandbox's own Go client then
// claims a sandbox, runs commands and moves files through the router, and
// suspends and resumes it by the Sandbox's operatingMode.
//
// It runs only with KOSA8_K8S=1 (make test-k8s), which builds the
// binaries once into a cache outside the repository.
package k8s

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/go-logr/logr"
	asb "sigs.k8s.io/agent-sandbox/clients/go/sandbox"
)

const ns = "kosa8"

var (
	k8sBin   string // kube-apiserver, kine, agent-sandbox-controller, sandbox-router
	kosa8Bin string // kosa8 and its agent
)

func TestMain(m *testing.M) {
	if os.Getenv("KOSA8_K8S") != "1" {
		fmt.Println("skipping the control-plane test: run 'make test-k8s' (builds kube-apiserver and agent-sandbox once, then boots a sandbox)")
		os.Exit(0)
	}
	k8sBin, kosa8Bin = os.Getenv("KOSA8_K8S_BIN"), os.Getenv("KOSA8_BIN")
	for _, f := range []string{filepath.Join(k8sBin, "kube-apiserver"), filepath.Join(k8sBin, "kine"), filepath.Join(k8sBin, "agent-sandbox-controller"),
		filepath.Join(k8sBin, "sandbox-router"), filepath.Join(kosa8Bin, "kosa8")} {
		if _, err := os.Stat(f); err != nil {
			fmt.Fprintf(os.Stderr, "%v: run 'make test-k8s', which builds it\n", err)
			os.Exit(1)
		}
	}
	os.Exit(m.Run())
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// proc starts a program whose output goes to a log file, ended with the
// test.
func proc(t *testing.T, logDir, name string, env []string, argv ...string) *exec.Cmd {
	t.Helper()
	f, err := os.Create(filepath.Join(logDir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr, cmd.Env = f, f, append(os.Environ(), env...)
	dieWithTest(cmd, syscall.SIGKILL)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
		f.Close()
		if t.Failed() {
			keepLog(t, f.Name())
		}
	})
	return cmd
}

// keepLog copies a log of a failed run to $TMPDIR/kosa8-k8s-logs, which
// outlives the test's folder, and prints its end.
func keepLog(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "---- %s: %v\n", path, err)
		return
	}
	keep := filepath.Join(os.TempDir(), "kosa8-k8s-logs")
	_ = os.MkdirAll(keep, 0o755)
	_ = os.WriteFile(filepath.Join(keep, filepath.Base(path)), b, 0o644)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	fmt.Fprintf(os.Stderr, "---- %s (end; all of it in %s)\n%s\n----\n", filepath.Base(path), keep, b)
}

// waitFor polls cond every 200 ms until it is true, saying what it waits
// for every 10 s.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	next := start.Add(10 * time.Second)
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not after %s", what, limit)
		}
		if time.Now().After(next) {
			t.Logf("waiting for %s (%s)", what, time.Since(start).Round(time.Second))
			next = time.Now().Add(10 * time.Second)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return time.Since(start)
}

// controlPlane starts kine and kube-apiserver; it returns an admin's
// config and a kubeconfig file of it.
func controlPlane(t *testing.T, dir string) (*rest.Config, string) {
	t.Helper()
	kinePort, apiPort := freePort(t), freePort(t)
	proc(t, dir, "kine", nil, filepath.Join(k8sBin, "kine"),
		"--endpoint", "sqlite://"+filepath.Join(dir, "kine.db")+"?_journal=WAL&cache=shared",
		"--listen-address", fmt.Sprintf("127.0.0.1:%d", kinePort), "--metrics-bind-address", "0")
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	saKey := filepath.Join(dir, "sa.key")
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		t.Fatal(err)
	}
	tok := make([]byte, 16)
	_, _ = rand.Read(tok)
	admin := hex.EncodeToString(tok)
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(admin+",admin,admin,system:masters\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	proc(t, dir, "kube-apiserver", nil, filepath.Join(k8sBin, "kube-apiserver"),
		"--etcd-servers", fmt.Sprintf("http://127.0.0.1:%d", kinePort),
		"--bind-address", "127.0.0.1",
		// The kubernetes Service's endpoint is never dialed here; the
		// reconciler refuses a loopback address for it.
		"--advertise-address", "10.96.0.1", "--endpoint-reconciler-type", "none", "--secure-port", strconv.Itoa(apiPort),
		"--cert-dir", filepath.Join(dir, "certs"), "--token-auth-file", tokens,
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey, "--service-cluster-ip-range", "10.96.0.0/16",
		"--enable-priority-and-fairness=false")
	cfg := &rest.Config{Host: fmt.Sprintf("https://127.0.0.1:%d", apiPort), BearerToken: admin,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true}, QPS: 50, Burst: 100}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, Timeout: 5 * time.Second}
	took := waitFor(t, "kube-apiserver's /readyz", 3*time.Minute, func() bool {
		req, _ := http.NewRequest("GET", cfg.Host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+admin)
		resp, err := hc.Do(req)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	t.Logf("kube-apiserver over kine ready in %s", took.Round(time.Millisecond))
	kubeconfig := filepath.Join(dir, "kubeconfig")
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: t, context: {cluster: t, user: admin}}]
current-context: t
`, cfg.Host, admin)
	if err := os.WriteFile(kubeconfig, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg, kubeconfig
}

// apply creates every object of the YAML files on the API server, which
// validates them (the CRDs' schemas, the pod template inside them, the
// admission plugins: PodSecurity's baseline among them).
func apply(t *testing.T, cfg *rest.Config, files ...string) {
	t.Helper()
	applyWith(t, cfg, nil, files...)
}

// applyWith is apply with each object changed by edit first, and with
// the create's options it returns (a dry run, for one).
func applyWith(t *testing.T, cfg *rest.Config, edit func(*unstructured.Unstructured) metav1.CreateOptions, files ...string) {
	t.Helper()
	dc := discovery.NewDiscoveryClientForConfigOrDie(cfg)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn := dynamic.NewForConfigOrDie(cfg)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
		for {
			var obj unstructured.Unstructured
			if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			gvk := obj.GroupVersionKind()
			var m *meta.RESTMapping
			// A CRD's kinds are served a moment after it is made.
			waitFor(t, "the API server to serve "+gvk.String(), time.Minute, func() bool {
				m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
				if err != nil {
					mapper.Reset()
				}
				return err == nil
			})
			var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if m.Scope.Name() == meta.RESTScopeNameNamespace {
				ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
			}
			opts := metav1.CreateOptions{FieldValidation: "Strict"}
			if edit != nil {
				opts = edit(&obj)
			}
			if _, err := ri.Create(context.Background(), &obj, opts); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("the API server refused %s %s of %s: %v", gvk.Kind, obj.GetName(), filepath.Base(f), err)
			}
		}
	}
}

// waitServed waits until the API server serves each group/version/kind
// (a CRD's kinds come a moment after it is made; the controller fails
// at its start on a kind not served yet).
func waitServed(t *testing.T, cfg *rest.Config, gvks ...string) {
	t.Helper()
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg)))
	for _, s := range gvks {
		i := strings.LastIndex(s, "/")
		gv, kind := s[:i], s[i+1:]
		j := strings.LastIndex(gv, "/")
		group, version := gv[:j], gv[j+1:]
		waitFor(t, "the API server to serve "+s, time.Minute, func() bool {
			_, err := mapper.RESTMapping(schema.GroupKind{Group: group, Kind: kind}, version)
			if err != nil {
				mapper.Reset()
			}
			return err == nil
		})
	}
}

// kubelet runs the pods of the namespace as a kubelet would: the
// container's command with the pod's environment, each volume a folder
// (a PVC's kept across pods, as the volume is), the container port a host
// port (the pod's IP is 127.0.0.1), the readiness probe polled and the
// pod's status reported; a pod being deleted gets SIGTERM and its grace
// period, then is removed. Two paths of the container's image are this
// host's: the kosa8 binaries (command[0] on its PATH) and the guest
// image (KOSA8_CACHE).
type kubelet struct {
	t     *testing.T
	cs    kubernetes.Interface
	dir   string
	cache string

	// port is the host port that stands for the pod IP's :8888 (pods run
	// one at a time here).
	port int

	mu   sync.Mutex
	pods map[types.UID]*podRun
}

type podRun struct {
	pod     string // KOSA8_SANDBOX_NAME: the pod's name
	cmd     *exec.Cmd
	port    int
	termAt  time.Time
	started time.Time
	ready   bool
	exited  chan struct{}
	// Suspend is how long SIGTERM to the end took; ReadyAfter the
	// container's start to its probe's first 200.
	suspend, readyAfter time.Duration
}

func (k *kubelet) run(ctx context.Context) {
	for ctx.Err() == nil {
		list, err := k.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err == nil {
			for i := range list.Items {
				k.sync(ctx, &list.Items[i])
			}
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func (k *kubelet) sync(ctx context.Context, pod *corev1.Pod) {
	k.mu.Lock()
	pr := k.pods[pod.UID]
	k.mu.Unlock()
	if pod.DeletionTimestamp != nil {
		if pr != nil && pr.termAt.IsZero() {
			pr.termAt = time.Now()
			_ = pr.cmd.Process.Signal(syscall.SIGTERM)
			grace := int64(30)
			if pod.Spec.TerminationGracePeriodSeconds != nil {
				grace = *pod.Spec.TerminationGracePeriodSeconds
			}
			go func() {
				select {
				case <-pr.exited:
				case <-time.After(time.Duration(grace) * time.Second):
					k.t.Logf("pod %s: grace period over: SIGKILL", pod.Name)
					_ = pr.cmd.Process.Kill()
					<-pr.exited
				}
				pr.suspend = time.Since(pr.termAt)
				zero := int64(0)
				_ = k.cs.CoreV1().Pods(ns).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
			}()
		} else if pr == nil {
			zero := int64(0)
			_ = k.cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		}
		return
	}
	if pr == nil {
		pr = k.start(ctx, pod)
		if pr == nil {
			return
		}
	}
	if pr.ready {
		return
	}
	c := pod.Spec.Containers[0]
	probe := c.ReadinessProbe
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", pr.port, probe.HTTPGet.Path))
	if err != nil {
		return
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return
	}
	pr.ready, pr.readyAfter = true, time.Since(pr.started)
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP, pod.Status.PodIPs, pod.Status.HostIP = "127.0.0.1", []corev1.PodIP{{IP: "127.0.0.1"}}, "127.0.0.1"
	pod.Status.StartTime = &now
	pod.Status.Conditions = nil
	for _, ct := range []corev1.PodConditionType{corev1.PodScheduled, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: ct, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: c.Name, Ready: true, Image: c.Image, ImageID: c.Image,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	if _, err := k.cs.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		pr.ready = false
		k.t.Logf("pod %s status: %v", pod.Name, err)
		return
	}
	k.t.Logf("pod %s ready %s after its container started", pod.Name, pr.readyAfter.Round(time.Millisecond))
}

func (k *kubelet) start(ctx context.Context, pod *corev1.Pod) *podRun {
	k.t.Helper()
	c := pod.Spec.Containers[0]
	// The scheduler's part: bind the pod to this node. It matters: the API
	// server deletes a pod bound to no node at once, without the grace
	// period in which kosa8 suspends.
	if pod.Spec.NodeName == "" {
		err := k.cs.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: ns},
			Target: corev1.ObjectReference{Kind: "Node", Name: "kosa8-test-node"}}, metav1.CreateOptions{})
		if err != nil {
			k.t.Logf("bind pod %s: %v", pod.Name, err)
			return nil
		}
	}
	podDir := filepath.Join(k.dir, "pods", string(pod.UID))
	// The pod's volumes as folders.
	vols := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			vols[v.Name] = filepath.Join(k.dir, "pvc", v.PersistentVolumeClaim.ClaimName)
		case v.EmptyDir != nil:
			vols[v.Name] = filepath.Join(podDir, "emptydir", v.Name)
		case v.Secret != nil:
			d := filepath.Join(podDir, "secret", v.Name)
			if err := os.MkdirAll(d, 0o700); err != nil {
				k.t.Error(err)
				return nil
			}
			sec, err := k.cs.CoreV1().Secrets(ns).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
			if err != nil {
				if v.Secret.Optional != nil && *v.Secret.Optional {
					vols[v.Name] = d
					continue
				}
				k.t.Logf("pod %s waits for secret %s: %v", pod.Name, v.Secret.SecretName, err)
				return nil
			}
			for key, val := range sec.Data {
				if err := os.WriteFile(filepath.Join(d, key), val, 0o600); err != nil {
					k.t.Error(err)
					return nil
				}
			}
			vols[v.Name] = d
		}
	}
	mounts := map[string]string{} // container path -> host folder
	for _, m := range c.VolumeMounts {
		if m.MountPath == "/dev/shm" {
			continue // the host's /dev/shm stands for the pod's memory-backed one
		}
		host := filepath.Join(vols[m.Name], m.SubPath)
		if err := os.MkdirAll(host, 0o700); err != nil {
			k.t.Error(err)
			return nil
		}
		mounts[m.MountPath] = host
	}
	mounts["/var/lib/kosa8/cache"] = k.cache // the image's guest image
	rewrite := func(v string) string {
		for cp, hp := range mounts {
			if v == cp || strings.HasPrefix(v, cp+"/") {
				return hp + strings.TrimPrefix(v, cp)
			}
		}
		return v
	}
	port := k.port
	env := []string{"PATH=" + kosa8Bin + ":" + os.Getenv("PATH"), "HOME=" + filepath.Join(podDir, "home"),
		fmt.Sprintf("KOSA8_SERVE_LISTEN=127.0.0.1:%d", port)} // the pod IP's :8888
	for _, e := range c.Env {
		val := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				val = pod.Name
			case "metadata.namespace":
				val = pod.Namespace
			}
		}
		env = append(env, e.Name+"="+rewrite(val))
	}
	if err := os.MkdirAll(filepath.Join(podDir, "home"), 0o700); err != nil {
		k.t.Error(err)
		return nil
	}
	argv := append(append([]string{}, c.Command...), c.Args...)
	argv[0] = filepath.Join(kosa8Bin, argv[0])
	logf, err := os.Create(filepath.Join(k.dir, pod.Name+"-"+string(pod.UID)[:8]+".log"))
	if err != nil {
		k.t.Error(err)
		return nil
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logf, logf
	dieWithTest(cmd, syscall.SIGTERM) // serve suspends its sandbox and ends
	if err := cmd.Start(); err != nil {
		k.t.Error(err)
		return nil
	}
	pr := &podRun{pod: pod.Name, cmd: cmd, port: port, started: time.Now(), exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); logf.Close(); close(pr.exited) }()
	k.mu.Lock()
	k.pods[pod.UID] = pr
	k.mu.Unlock()
	k.t.Logf("pod %s: started %v (its port 8888 is 127.0.0.1:%d)", pod.Name, c.Command, port)
	return pr
}

func (k *kubelet) stopAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, pr := range k.pods {
		select {
		case <-pr.exited:
		default:
			_ = pr.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-pr.exited:
			case <-time.After(2 * time.Minute):
				_ = pr.cmd.Process.Kill()
			}
		}
	}
}

func (k *kubelet) lastPod() *podRun {
	k.mu.Lock()
	defer k.mu.Unlock()
	var last *podRun
	for _, pr := range k.pods {
		if last == nil || pr.started.After(last.started) {
			last = pr
		}
	}
	return last
}

// routerTransport adds the token where the sandbox-router lets it through.
type routerTransport struct{ token string }

func (rt routerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Kosa8-Token", rt.token)
	return http.DefaultTransport.RoundTrip(r)
}

func TestAgentSandboxControlPlane(t *testing.T) {
	dir := t.TempDir()
	cfg, kubeconfig := controlPlane(t, dir)
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()

	// agent-sandbox as its release installs it: CRDs (served, validated);
	// the controller runs here as a process with its extensions on.
	crds, _ := filepath.Glob(filepath.Join(os.Getenv("KOSA8_AGENT_SANDBOX_DIR"), "k8s", "crds", "*.yaml"))
	if len(crds) != 4 {
		t.Fatalf("agent-sandbox's CRDs: found %v in KOSA8_AGENT_SANDBOX_DIR", crds)
	}
	apply(t, cfg, crds...)
	waitServed(t, cfg, "agents.x-k8s.io/v1beta1/Sandbox", "extensions.agents.x-k8s.io/v1beta1/SandboxClaim",
		"extensions.agents.x-k8s.io/v1beta1/SandboxTemplate", "extensions.agents.x-k8s.io/v1beta1/SandboxWarmPool")
	proc(t, dir, "agent-sandbox-controller", []string{"KUBECONFIG=" + kubeconfig}, filepath.Join(k8sBin, "agent-sandbox-controller"),
		"--extensions", "--leader-elect=false", "--metrics-bind-address=0", "--health-probe-bind-address=0")

	// kosa8's manifests, as `kubectl apply -f deploy/kubernetes/` does
	// (the Secrets made as docs/kubernetes.md says).
	manifests, _ := filepath.Glob("../../deploy/kubernetes/*.yaml")
	apply(t, cfg, manifests...)
	// The TCG variant, validated the same way (a dry run under another
	// name: it would replace the template).
	applyWith(t, cfg, func(o *unstructured.Unstructured) metav1.CreateOptions {
		o.SetName("kosa8-tcg-dry-run")
		return metav1.CreateOptions{FieldValidation: "Strict", DryRun: []string{metav1.DryRunAll}}
	}, "../../deploy/kubernetes/tcg/30-template.yaml")
	tok := make([]byte, 32)
	_, _ = rand.Read(tok)
	token := hex.EncodeToString(tok)
	const keyValue = "sk-ant-k8s-e2e-real-key-0123456789"
	for name, data := range map[string]map[string][]byte{
		"kosa8-token": {"token": []byte(token)},
		"kosa8-keys":  {"ANTHROPIC_API_KEY": []byte(keyValue)},
	} {
		if _, err := cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	routerPort := freePort(t)
	proc(t, dir, "sandbox-router", []string{"KUBECONFIG=" + kubeconfig}, filepath.Join(k8sBin, "sandbox-router"),
		"--http-bind-address", fmt.Sprintf("127.0.0.1:%d", routerPort), "--metrics-bind-address", "127.0.0.1:0", "--health-probe-bind-address", "127.0.0.1:0",
		"--allow-loopback-pod-ip", "--cache-enabled=false")

	cache := os.Getenv("KOSA8_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "kosa8")
	}
	// The node's folders: a short path (a sandbox's API socket is under
	// its volume, and a unix socket's path is at most 107 bytes; in the pod
	// it is /var/lib/kosa8/state/sandboxes/NAME/api.sock). The pods' cache
	// is the host's guest images, linked, with boot templates of its own,
	// so that this run evicts none of the host's.
	node, err := os.MkdirTemp("", "k8")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(node) })
	podCache := filepath.Join(node, "cache")
	if err := os.MkdirAll(podCache, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(cache, "images"), filepath.Join(podCache, "images")); err != nil {
		t.Fatal(err)
	}
	kl := &kubelet{t: t, cs: cs, dir: node, cache: podCache, port: freePort(t), pods: map[types.UID]*podRun{}}
	klCtx, stopKubelet := context.WithCancel(ctx)
	go kl.run(klCtx)
	defer func() {
		stopKubelet()
		kl.stopAll()
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(kl.dir, "*.log"))
			for _, l := range logs {
				keepLog(t, l)
			}
			sbs, _ := filepath.Glob(filepath.Join(kl.dir, "pvc", "*", "state", "sandboxes", "*", "*.log"))
			for _, l := range sbs {
				keepLog(t, l)
			}
		}
	}()

	// A user's program: agent-sandbox's Go client claims a sandbox of the
	// kosa8 warm pool, waits for it to be Ready (the controller reads the
	// pod's readiness, which is kosa8's agent answering), then speaks to
	// it through the sandbox-router, which dials the pod's IP at
	// X-Sandbox-Port.
	helper, err := asb.NewK8sHelper(cfg, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	client, err := asb.NewClient(ctx, asb.Options{
		Namespace: ns, Quiet: true, K8sHelper: helper,
		APIURL:        fmt.Sprintf("http://127.0.0.1:%d", routerPort),
		ServerPort:    kl.port,
		HTTPTransport: routerTransport{token}, SandboxReadyTimeout: 5 * time.Minute,
		RequestTimeout: 3 * time.Minute, PerAttemptTimeout: 2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	sb, err := client.CreateSandbox(ctx, "kosa8", ns)
	if err != nil {
		t.Fatalf("agent-sandbox's client: %v", err)
	}
	t.Logf("claim %s → sandbox %s, pod %s at %s: ready %s after the claim", sb.ClaimName(), sb.SandboxName(), sb.PodName(), sb.PodIP(), time.Since(start).Round(time.Millisecond))

	run := func(command string) string {
		t.Helper()
		res, err := sb.Run(ctx, command)
		if err != nil {
			t.Fatalf("run %q: %v", command, err)
		}
		if res.ExitCode != 0 {
			t.Fatalf("run %q: exit %d: %s", command, res.ExitCode, res.Stderr)
		}
		return strings.TrimSpace(res.Stdout)
	}
	if got := run("uname -s; id -un"); !strings.HasPrefix(got, "Linux\n") {
		t.Fatalf("uname -s; id -un = %q", got)
	}
	if ph := run(`echo "$ANTHROPIC_API_KEY"`); !strings.HasPrefix(ph, "kosa8-ph-") {
		t.Fatalf("the guest holds ANTHROPIC_API_KEY=%q, not a placeholder", ph)
	}
	if err := sb.Write(ctx, "up.txt", []byte("uploaded through the router")); err != nil {
		t.Fatal(err)
	}
	if got, err := sb.Read(ctx, "up.txt"); err != nil || string(got) != "uploaded through the router" {
		t.Fatalf("download: %q, %v", got, err)
	}
	if ok, err := sb.Exists(ctx, "up.txt"); err != nil || !ok {
		t.Fatalf("exists: %v, %v", ok, err)
	}
	// The workspace is the pod's volume (subPath workspace of its PVC).
	pvcs, _ := filepath.Glob(filepath.Join(kl.dir, "pvc", "*", "workspace", "up.txt"))
	waitFor(t, "up.txt synced to the workspace volume", time.Minute, func() bool {
		pvcs, _ = filepath.Glob(filepath.Join(kl.dir, "pvc", "*", "workspace", "up.txt"))
		return len(pvcs) == 1
	})
	run(`(nohup sh -c 'echo $$ > /tmp/counter.pid; n=0; while :; do n=$((n+1)); echo $n > /tmp/count.tmp; mv /tmp/count.tmp /tmp/count; sleep 0.2; done' >/dev/null 2>&1 &)`)
	pid := run(`for i in $(seq 100); do [ -s /tmp/count ] && break; sleep 0.1; done; cat /tmp/counter.pid`)
	time.Sleep(time.Second)
	before, _ := strconv.Atoi(run("cat /tmp/count"))

	// Suspend, as a user does: kubectl patch sandbox S --type merge -p
	// '{"spec":{"operatingMode":"Suspended"}}'.
	setMode := func(mode string) {
		t.Helper()
		patch := []byte(`{"spec":{"operatingMode":"` + mode + `"}}`)
		if _, err := helper.AgentsClient.Sandboxes(ns).Patch(ctx, sb.SandboxName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	first := kl.lastPod()
	t0 := time.Now()
	setMode("Suspended")
	suspended := waitFor(t, "the Sandbox's Suspended condition", 4*time.Minute, func() bool {
		s, err := helper.AgentsClient.Sandboxes(ns).Get(ctx, sb.SandboxName(), metav1.GetOptions{})
		return err == nil && meta.IsStatusConditionTrue(s.Status.Conditions, "Suspended")
	})
	t.Logf("suspended: the patch to Suspended=True %s; SIGTERM to kosa8's end (the machine written to the volume) %s", suspended.Round(time.Millisecond), first.suspend.Round(time.Millisecond))
	if pods, _ := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); len(pods.Items) != 0 {
		t.Fatalf("%d pods while suspended", len(pods.Items))
	}
	st, _ := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(pvcs[0])), "state", "sandboxes", first.name(), "state.json"))
	if !strings.Contains(string(st), `"paused"`) {
		t.Fatalf("the volume's sandbox after the suspend: %s", st)
	}
	_ = t0

	t1 := time.Now()
	setMode("Running")
	waitFor(t, "the Sandbox Ready again", 5*time.Minute, func() bool {
		s, err := helper.AgentsClient.Sandboxes(ns).Get(ctx, sb.SandboxName(), metav1.GetOptions{})
		return err == nil && meta.IsStatusConditionTrue(s.Status.Conditions, "Ready")
	})
	second := kl.lastPod()
	if second == first {
		t.Fatal("no new pod after the resume")
	}
	t.Logf("resumed: the patch to Ready %s (the new pod's container start to ready %s)", time.Since(t1).Round(time.Millisecond), second.readyAfter.Round(time.Millisecond))
	after, _ := strconv.Atoi(run("cat /tmp/count"))
	time.Sleep(time.Second)
	later, _ := strconv.Atoi(run("cat /tmp/count"))
	if after < before || later <= after || after > before+25 {
		t.Fatalf("the count went %d before the suspend, %d then %d after: it must go on from where it was", before, after, later)
	}
	if got := run(`p=$(cat /tmp/counter.pid); kill -0 "$p" && echo "$p"`); got != pid {
		t.Fatalf("the counter is pid %s after the resume, %s before", got, pid)
	}
	if got, err := sb.Read(ctx, "up.txt"); err != nil || string(got) != "uploaded through the router" {
		t.Fatalf("download after the resume: %q, %v", got, err)
	}
	if err := client.DeleteSandbox(ctx, sb.ClaimName(), ns); err != nil {
		t.Fatal(err)
	}
}

// name is the kosa8 sandbox the pod made: named after the pod.
func (p *podRun) name() string { return p.pod }
