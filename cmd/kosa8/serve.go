package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/config"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/internal/serve"
	"github.com/kosa8/kosa8/sdk"
)

// env is the environment's value of key, else def: every serve flag has
// one, so a pod sets it in its env or a mounted file.
func env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func envList(key string) []string {
	var out []string
	for _, s := range strings.Split(os.Getenv(key), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func serveCmd() *cobra.Command {
	var o struct {
		listen, name, tokenFile, cert, key, clientCA, configFile, workspace, git, secretsDir string
		baseDir, onTerm, cpus, memory, disk, preset                                          string
		allow, envs                                                                          []string
		execTimeout, stopTimeout                                                             time.Duration
	}
	hostname, _ := os.Hostname()
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve one sandbox over TCP, for a Kubernetes pod (agent-sandbox's runtime contract and kosa8's API)",
		Long: `Serve one sandbox, the whole of kosa8 in one process: it creates the sandbox in $KOSA8_HOME
(the pod's volume) or continues the one there, and answers agent-sandbox's runtime contract
(POST /execute, /upload, GET /download/…, /list/…, /exists/…) and kosa8's own API (/kosa8/v1/…)
on --listen, to callers with the token or a client certificate. On SIGTERM it suspends the
sandbox to the volume (memory included), so a pod started on that volume continues it.

Every flag can be set by the environment variable named in its help. In full:
docs/kubernetes.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
			token := ""
			if o.tokenFile != "" {
				t, err := serve.ReadToken(o.tokenFile)
				if err != nil {
					return err
				}
				token = t
			}
			var tlsConf *tls.Config
			if o.cert != "" || o.key != "" {
				c, err := serve.TLSConfig(o.cert, o.key, o.clientCA)
				if err != nil {
					return err
				}
				tlsConf = c
			} else if o.clientCA != "" {
				return fmt.Errorf("--client-ca needs --tls-cert and --tls-key")
			}
			auth, err := serve.NewAuth(token, o.clientCA != "")
			if err != nil {
				return err
			}
			co, err := createOptions(o.configFile)
			if err != nil {
				return err
			}
			co.Workspace = o.workspace
			for _, v := range []struct {
				s   string
				dst *string
			}{{o.memory, &co.Memory}, {o.disk, &co.Disk}, {o.preset, &co.Preset}} {
				if v.s != "" {
					*v.dst = v.s
				}
			}
			if o.cpus != "" {
				if co.CPUs, err = strconv.Atoi(o.cpus); err != nil {
					return fmt.Errorf("--cpus %q: %w", o.cpus, err)
				}
			}
			co.Allow = append(co.Allow, o.allow...)
			co.Env = append(co.Env, o.envs...)
			specs, err := serve.SecretsFromEnv(o.secretsDir, os.Getenv)
			if err != nil {
				return err
			}
			for _, s := range specs {
				co.Secrets = appendNew(co.Secrets, s.Name)
			}
			paths, err := sandbox.DefaultPaths()
			if err != nil {
				return err
			}
			client, err := sdk.New()
			if err != nil {
				return err
			}
			signal.Ignore(syscall.SIGHUP, syscall.SIGPIPE)
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return serve.Run(ctx, client, serve.Options{
				Listen: o.listen, TLS: tlsConf, Auth: auth, Name: o.name, Create: co,
				ConfigDir: paths.Config, Secrets: specs, GitClone: o.git, BaseDir: o.baseDir,
				ExecTimeout: o.execTimeout, OnTerm: serve.OnTerm(o.onTerm), StopTimeout: o.stopTimeout, Log: log,
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", env("KOSA8_SERVE_LISTEN", ":8888"), "address to listen on ($KOSA8_SERVE_LISTEN; 8888 is the sandbox-router's port)")
	f.StringVar(&o.name, "name", env("KOSA8_SANDBOX_NAME", hostname), "the sandbox's name, and the X-Sandbox-ID the router names it by ($KOSA8_SANDBOX_NAME, else the host name: the pod's)")
	f.StringVar(&o.tokenFile, "token-file", env("KOSA8_SERVE_TOKEN_FILE", ""), "file holding the callers' token, a mounted Secret ($KOSA8_SERVE_TOKEN_FILE)")
	f.StringVar(&o.cert, "tls-cert", env("KOSA8_SERVE_TLS_CERT", ""), "serve TLS with this certificate ($KOSA8_SERVE_TLS_CERT)")
	f.StringVar(&o.key, "tls-key", env("KOSA8_SERVE_TLS_KEY", ""), "and this key ($KOSA8_SERVE_TLS_KEY)")
	f.StringVar(&o.clientCA, "client-ca", env("KOSA8_SERVE_CLIENT_CA", ""), "accept client certificates of this CA (mTLS) ($KOSA8_SERVE_CLIENT_CA)")
	f.StringVar(&o.configFile, "config", env("KOSA8_SERVE_CONFIG", ""), "a kosa8.toml mounted by the operator (read as trusted) ($KOSA8_SERVE_CONFIG)")
	f.StringVar(&o.workspace, "workspace", env("KOSA8_SERVE_WORKSPACE", ""), "a folder (a volume) synced as the sandbox's workspace ($KOSA8_SERVE_WORKSPACE)")
	f.StringVar(&o.git, "git-clone", env("KOSA8_SERVE_GIT_CLONE", ""), "clone this repository into the workspace at the first start; its host must be allowed ($KOSA8_SERVE_GIT_CLONE)")
	f.StringVar(&o.secretsDir, "secrets-dir", env("KOSA8_SECRETS_DIR", "/var/run/secrets/kosa8"), "a mounted Secret: each file NAME is a key the broker injects, with KOSA8_SECRET_NAME_HOSTS (and _HEADER, _FORMAT) set ($KOSA8_SECRETS_DIR)")
	f.StringVar(&o.baseDir, "base-dir", env("KOSA8_SERVE_BASE_DIR", ""), "guest folder the contract's paths are under (default: the workspace, else the user's home) ($KOSA8_SERVE_BASE_DIR)")
	f.StringVar(&o.onTerm, "on-term", env("KOSA8_SERVE_ON_TERM", "suspend"), "on SIGTERM: suspend (memory kept on the volume) or stop ($KOSA8_SERVE_ON_TERM)")
	f.StringVar(&o.cpus, "cpus", env("KOSA8_SERVE_CPUS", ""), "virtual CPUs ($KOSA8_SERVE_CPUS)")
	f.StringVar(&o.memory, "memory", env("KOSA8_SERVE_MEMORY", ""), "guest memory, e.g. 2G ($KOSA8_SERVE_MEMORY)")
	f.StringVar(&o.disk, "disk", env("KOSA8_SERVE_DISK", ""), "root disk size ($KOSA8_SERVE_DISK)")
	f.StringVar(&o.preset, "net", env("KOSA8_SERVE_NET", ""), "network preset: none or dev ($KOSA8_SERVE_NET)")
	f.StringSliceVar(&o.allow, "allow", envList("KOSA8_SERVE_ALLOW"), "allow-list rules, comma-separated ($KOSA8_SERVE_ALLOW)")
	f.StringSliceVar(&o.envs, "env", nil, "KEY=VALUE for every command in the guest")
	f.DurationVar(&o.execTimeout, "exec-timeout", durationEnv("KOSA8_SERVE_EXEC_TIMEOUT", 300*time.Second), "time limit of one /execute ($KOSA8_SERVE_EXEC_TIMEOUT)")
	f.DurationVar(&o.stopTimeout, "stop-timeout", durationEnv("KOSA8_SERVE_STOP_TIMEOUT", 100*time.Second), "time limit of the suspend at SIGTERM: keep it under the pod's grace period ($KOSA8_SERVE_STOP_TIMEOUT)")
	return cmd
}

func durationEnv(key string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(key)); err == nil {
		return d
	}
	return def
}

func appendNew(list []string, s string) []string {
	for _, e := range list {
		if e == s {
			return list
		}
	}
	return append(list, s)
}

// createOptions reads a kosa8.toml the operator mounted: the pod's
// settings are the operator's, not a cloned repository's, so no trust
// record is asked for.
func createOptions(file string) (sdk.CreateOptions, error) {
	var co sdk.CreateOptions
	if file == "" {
		return co, nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return co, fmt.Errorf("read --config: %w", err)
	}
	p, err := config.Parse(b)
	if err != nil {
		return co, fmt.Errorf("%s: %w", file, err)
	}
	co.CPUs, co.Memory, co.Disk, co.Env = p.Sandbox.CPUs, p.Sandbox.Memory, p.Sandbox.Disk, p.Sandbox.Env
	co.Preset, co.Allow, co.Ports = p.Network.Preset, p.Network.Allow, p.Network.Ports
	co.Secrets, co.Exclude, co.Review = p.Secrets.Use, p.Workspace.Exclude, p.Workspace.Review
	return co, nil
}
