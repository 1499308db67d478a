package supervisor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/egress"
	"github.com/kosa8/kosa8/internal/guest"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/secrets"
)

// dockerStartTimeout is what a start waits for the engine beyond the boot
// (the agent gives dockerd 150 s).
const dockerStartTimeout = 160 * time.Second

// startDocker asks the guest to start its container engine (a sandbox made
// with --docker) and waits until it answers. After a restore the engine
// runs already (it is part of the machine) and this returns at once.
// dockerd pulls through the gateway's CONNECT proxy, so a refused registry
// is told why; registry secrets become logins in the guest's Docker
// settings, with placeholders.
func (s *supervisor) startDocker(ctx context.Context, configDir string) error {
	t := time.Now()
	auths, err := dockerAuths(s.sb, configDir)
	if err != nil {
		return err
	}
	req := guest.DockerRequest{Proxy: egress.ProxyURL(), Auths: auths}
	if err := s.currentClient().Docker(ctx, req); err != nil {
		return fmt.Errorf("start the container engine: %w (its log in the guest: /var/log/kosa8-dockerd.log)", err)
	}
	s.log.Info("container engine ready", "ms", msSince(t))
	return nil
}

// dockerHubHosts are the hosts of Docker Hub's login: its registry and its
// token service. Docker keys Hub's login by its old index URL.
var dockerHubHosts = []string{"auth.docker.io", "registry-1.docker.io", "index.docker.io", "docker.io"}

// dockerAuths are the guest's registry logins: one per bound secret of
// format registry:USER, keyed as docker looks them up (the registry's host,
// Docker Hub's index URL), holding the sandbox's placeholder.
func dockerAuths(sb *sandbox.Sandbox, configDir string) ([]guest.DockerAuth, error) {
	if len(sb.Config.Secrets) == 0 {
		return nil, nil
	}
	store, err := secrets.Open(configDir)
	if err != nil {
		return nil, err
	}
	ph, err := sb.Placeholders()
	if err != nil {
		return nil, err
	}
	var out []guest.DockerAuth
	for _, name := range sb.Config.Secrets {
		sec, err := store.Describe(name)
		if err != nil {
			return nil, err
		}
		user, ok := sec.Registry()
		if !ok {
			continue
		}
		for _, h := range sec.Hosts {
			if strings.HasPrefix(h, "*.") {
				continue
			}
			key := h
			for _, hub := range dockerHubHosts {
				if h == hub {
					key = "https://index.docker.io/v1/"
				}
			}
			out = append(out, guest.DockerAuth{Registry: key, User: user, Placeholder: ph[name]})
		}
	}
	return out, nil
}
