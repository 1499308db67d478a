package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kosa8/kosa8/internal/access"
	"github.com/kosa8/kosa8/internal/api"
	"github.com/kosa8/kosa8/internal/checkpoint"
	"github.com/kosa8/kosa8/sdk"
)

// OnTerm is what serve does with its sandbox when it is told to end
// (SIGTERM: the pod is deleted, the Sandbox suspended, the node drained).
type OnTerm string

const (
	// Suspend writes the running machine (memory, devices, disks) to the
	// state directory, which is the pod's volume, so that a pod started on
	// that volume continues it where it was. It is the default: the pod
	// cannot tell a suspend from a deletion, and a deleted Sandbox's
	// volume goes with it.
	Suspend OnTerm = "suspend"
	// Stop powers the guest off cleanly; the next pod boots it from its
	// disks.
	Stop OnTerm = "stop"
)

// Options are one `kosa8 serve`.
type Options struct {
	Listen string      // ":8888"
	TLS    *tls.Config // nil: plain HTTP
	Auth   *Auth
	// Name is the sandbox's name in kosa8 and the name the router's
	// X-Sandbox-ID gives it (the pod's name).
	Name   string
	Create sdk.CreateOptions // used when the state directory holds no sandbox of that name
	// ConfigDir is where mounted secrets are imported to (KOSA8_CONFIG):
	// memory-backed, never the checkpoint volume.
	ConfigDir string
	Secrets   []SecretSpec
	// GitClone is cloned into the guest's workspace at the first start
	// when it holds no .git yet.
	GitClone    string
	BaseDir     string
	ExecTimeout time.Duration
	OnTerm      OnTerm
	// StopTimeout bounds the suspend (or stop) at the end: within the
	// pod's terminationGracePeriodSeconds.
	StopTimeout time.Duration
	Log         *slog.Logger
}

// Run serves one sandbox until ctx ends, then suspends (or stops) it. The
// listener answers at once: GET /ready says 503 until the guest does.
func Run(ctx context.Context, c *sdk.Client, o Options) error {
	log := o.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	if o.OnTerm == "" {
		o.OnTerm = Suspend
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = 100 * time.Second
	}
	if err := ImportSecrets(o.ConfigDir, o.Secrets); err != nil {
		return err
	}
	sb, created, err := openOrCreate(ctx, c, o)
	if err != nil {
		return err
	}
	info := sb.Info()
	log = log.With("sandbox", info.Name, "id", info.ID)
	srv := &Server{
		Machine: sdkMachine{sb}, Auth: o.Auth,
		Scope: access.Only(info.ID), Target: access.Target{ID: info.ID, Name: o.Name},
		BaseDir: o.BaseDir, ExecTimeout: o.ExecTimeout,
		API: apiProxy(filepath.Join(info.Dir, "api.sock"), info.ID), Log: log,
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", o.Listen, err)
	}
	// An idle connection (one that sent no credential, too) is closed after
	// two minutes; a request itself may take long (an upload, an execute).
	hs := &http.Server{Handler: srv.Handler(), TLSConfig: o.TLS, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	served := make(chan error, 1)
	go func() {
		if o.TLS != nil {
			served <- hs.ServeTLS(ln, "", "")
		} else {
			served <- hs.Serve(ln)
		}
	}()
	log.Info("listening", "addr", ln.Addr().String(), "tls", o.TLS != nil, "state", info.State)

	start := time.Now()
	resumed := info.State == sdk.Paused
	if err := sb.Start(ctx); err != nil && !errors.Is(err, sdk.ErrRunning) {
		_ = hs.Close()
		return fmt.Errorf("start the sandbox: %w", err)
	}
	log.Info("sandbox ready", "resumed", resumed, "created", created, "ms", time.Since(start).Milliseconds())
	if created && o.GitClone != "" {
		if err := gitClone(ctx, sb, o.GitClone, o.BaseDir); err != nil {
			_ = hs.Close()
			return err
		}
	}
	srv.SetReady(true)

	var runErr error
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
watch:
	for {
		select {
		case <-ctx.Done():
			break watch
		case err := <-served:
			runErr = fmt.Errorf("the listener ended: %w", err)
			break watch
		case <-tick.C:
			// A sandbox stopped or paused through kosa8's API, or whose
			// supervisor died, ends serve: the kubelet restarts the
			// container, which starts (or resumes) it, so a Ready pod always
			// serves a running sandbox. Suspending is the Sandbox's
			// operatingMode's business.
			switch st := sb.Info().State; st {
			case sdk.Running:
			case sdk.Crashed:
				srv.SetReady(false)
				runErr = fmt.Errorf("the sandbox's supervisor died: %s", sb.Info().Error)
				break watch
			case sdk.Stopped, sdk.Paused:
				srv.SetReady(false)
				log.Info("the sandbox was " + string(st) + " through kosa8's API: ending, for the container to be started again")
				break watch
			}
		}
	}
	srv.SetReady(false)
	end, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.StopTimeout)
	defer cancel()
	if st := sb.Info().State; st == sdk.Running {
		t0 := time.Now()
		if o.OnTerm == Suspend {
			err = sb.Pause(end)
		} else {
			err = sb.Stop(end)
		}
		if err != nil {
			runErr = errors.Join(runErr, fmt.Errorf("%s the sandbox: %w", o.OnTerm, err))
		} else {
			log.Info("sandbox ended", "how", string(o.OnTerm), "ms", time.Since(t0).Milliseconds(), "checkpoint", sb.Info().Checkpoint)
			dropSpares(log, info.Dir)
		}
	}
	_ = hs.Shutdown(end)
	return runErr
}

// openOrCreate opens the sandbox on the volume, or makes it. A volume
// holding one sandbox is that sandbox's whatever o.Name is now: a pod made
// again after a suspend may have another name than the one that suspended
// it (a warm pool's pod is adopted under its own name).
// dropSpares removes the spare RAM files of a stopped sandbox's
// checkpoints folder: each is as large as the guest's RAM, kept so that a
// checkpoint overwrites pages instead of filling new ones (a cache the
// supervisor refills after a start). On a laptop they cost disk the user
// has; on a pod's volume, two of them doubled a 2 GiB guest's suspended size
// (2 GiB each, against 350 MiB of RAM in use), so they go when the pod does.
func dropSpares(log *slog.Logger, dir string) {
	spares, _ := filepath.Glob(filepath.Join(dir, "checkpoints", checkpoint.SpareName+"*"))
	for _, p := range spares {
		if err := os.Remove(p); err != nil {
			log.Warn("remove a spare RAM file", "err", err)
		}
	}
}

func openOrCreate(ctx context.Context, c *sdk.Client, o Options) (*sdk.Sandbox, bool, error) {
	name := o.Name
	if list, err := c.List(ctx); err == nil && len(list) == 1 {
		name = list[0].Name
	}
	sb, err := c.Open(name)
	if err == nil {
		return sb, false, nil
	}
	if !errors.Is(err, sdk.ErrNotFound) {
		return nil, false, err
	}
	co := o.Create
	co.Name = o.Name
	sb, err = c.Create(ctx, co)
	if err != nil {
		return nil, false, fmt.Errorf("create the sandbox: %w", err)
	}
	return sb, true, nil
}

func gitClone(ctx context.Context, sb *sdk.Sandbox, url, dir string) error {
	if strings.HasPrefix(url, "-") {
		return fmt.Errorf("git clone %q: not a repository URL", url)
	}
	script := `[ -e .git ] || { [ -z "$(ls -A)" ] && git clone -- "$1" . ; }`
	stderr := &capped{max: 4 << 10}
	res, err := sb.Exec(ctx, sdk.Cmd{Args: []string{"sh", "-c", script, "sh", url}, Dir: dir, Stderr: stderr, Timeout: 10 * time.Minute})
	if err != nil {
		return fmt.Errorf("git clone %s: %w", url, err)
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("git clone %s in the guest failed (is its host on the allow-list?): %s", url, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// sdkMachine runs the contract's commands through the SDK.
type sdkMachine struct{ sb *sdk.Sandbox }

func (m sdkMachine) Exec(ctx context.Context, c Command) (int, error) {
	res, err := m.sb.Exec(ctx, sdk.Cmd{Args: c.Args, Dir: c.Dir, Stdin: c.Stdin, Stdout: c.Stdout, Stderr: c.Stderr, Timeout: c.Timeout})
	if err != nil {
		return -1, err
	}
	if res.TimedOut {
		return -1, fmt.Errorf("the command ran longer than %s and was killed", c.Timeout)
	}
	return res.ExitCode, nil // 128+signal when a signal ended it
}

// apiProxy forwards kosa8's own API to the supervisor's socket, naming
// the sandbox's identity as every kosa8 client does (the supervisor
// refuses another).
func apiProxy(sock, id string) http.Handler {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	return &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host, r.Out.Host = "http", "kosa8", "kosa8"
			r.Out.Header.Del("Authorization")
			r.Out.Header.Del(TokenHeader)
			r.Out.Header.Set(api.SandboxIDHeader, id)
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			writeJSON(w, http.StatusBadGateway, message("kosa8's API of this sandbox does not answer (is it running?)"))
		},
	}
}
