package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/kosa8/kosa8/internal/access"
	"github.com/kosa8/kosa8/internal/folder"
	"github.com/kosa8/kosa8/internal/sandbox"
	"github.com/kosa8/kosa8/sdk"
)

func mcpCmd() *cobra.Command {
	var folders, sandboxes []string
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve sandboxes to a model as MCP tools over stdio",
		Long: `Serve the Model Context Protocol on standard input and output, so that an agent
(Claude Code, Codex, Gemini CLI, ...) can create or pick a sandbox for a folder, run
commands in it, read and write its files, checkpoint and rewind it, and see what its
network refused. The model cannot widen the network: net_request_approval only
asks you, and you approve with 'kosa8 net allow'.

The model may pick only the folder kosa8 mcp was started in (the project the
agent runs in) and folders below it, or those named with --folder; never your
home directory, a folder above it, or /. Its tools act only on the sandboxes
this session created or picked (not on your other sandboxes, even by name),
and on those you name with --sandbox (the first is the one the tools act on
until the model picks another); each must have its folder among the above.

  claude mcp add kosa8 -- kosa8 mcp`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			c, err := sdk.New()
			if err != nil {
				return err
			}
			roots, err := mcpRoots(folders)
			if err != nil {
				return err
			}
			srv, s := newMCPSession(c, log, roots...)
			if err := s.give(sandboxes); err != nil {
				return err
			}
			return srv.Run(cmd.Context(), &mcp.StdioTransport{})
		},
	}
	cmd.Flags().StringArrayVar(&folders, "folder", nil, "a folder (with those below it) the model may make sandboxes for (default: the current folder)")
	cmd.Flags().StringArrayVar(&sandboxes, "sandbox", nil, "a sandbox of those folders the model may use without picking it (repeatable; the first is the default)")
	return cmd
}

// mcpRoots are the folders a model may pick sandboxes in: those named, or
// the current folder; resolved (folder.Resolve), and never /, the home
// directory or a folder above it, whose folders hold keys and
// credentials.
func mcpRoots(names []string) ([]folder.Path, error) {
	if len(names) == 0 {
		names = []string{"."}
	}
	home, _ := sandbox.HomeFolder()
	var roots []folder.Path
	for _, n := range names {
		f, err := folder.Resolve(n)
		if err != nil {
			return nil, fmt.Errorf("--folder %s: %w", n, err)
		}
		if f.String() == "/" || (!home.IsZero() && f.Holds(home)) {
			return nil, fmt.Errorf("kosa8 mcp would let the model pick any folder under %s (your keys and credentials among them): start it in a project folder, or name one with --folder", f.String())
		}
		roots = append(roots, f)
	}
	return roots, nil
}

// mcpServer serves one MCP session: what it may touch is its scope (the
// sandboxes it created or picked, of folders within its roots); the tools
// act on the sandbox picked last unless they name another of the scope.
type mcpServer struct {
	c     *sdk.Client
	log   *slog.Logger
	scope *access.Scope

	mu      sync.Mutex
	current string // the name of the sandbox picked last
}

const mcpInstructions = `kosa8 runs commands in a sandbox: a virtual machine with its own kernel, one
project folder (synced both ways with the user's folder), a network closed except
for the hosts the user allowed, and checkpoints of the whole machine.
Call sandbox_create_or_pick with the project folder first; the other tools then act
on that sandbox. Take a checkpoint before anything risky and rewind if it goes wrong.
When the network refuses a host you need, call net_blocked and then
net_request_approval: only the user can allow a host.`

// newMCPServer serves c's sandboxes; the model may pick folders within
// roots only.
func newMCPServer(c *sdk.Client, log *slog.Logger, roots ...folder.Path) *mcp.Server {
	srv, _ := newMCPSession(c, log, roots...)
	return srv
}

// newMCPSession is newMCPServer with the session's state, for tests.
func newMCPSession(c *sdk.Client, log *slog.Logger, roots ...folder.Path) (*mcp.Server, *mcpServer) {
	s := &mcpServer{c: c, log: log, scope: access.Folders("the user can add a folder with 'kosa8 mcp --folder'", roots...)}
	srv := mcp.NewServer(&mcp.Implementation{Name: "kosa8", Title: "kosa8 sandboxes", Version: release}, &mcp.ServerOptions{Instructions: mcpInstructions, Logger: log})
	no := false
	mcp.AddTool(srv, &mcp.Tool{Name: "sandbox_create_or_pick", Description: "Pick the sandbox of a project folder, starting it if needed, or create and start one. The other tools act on it afterwards. Network rules come from the user (kosa8.toml they trusted, or 'kosa8 net allow'), never from this call.",
		Annotations: &mcp.ToolAnnotations{Title: "Create or pick a sandbox", DestructiveHint: &no, IdempotentHint: true, OpenWorldHint: &no}}, s.createOrPick)
	mcp.AddTool(srv, &mcp.Tool{Name: "run", Description: "Run a shell command (bash -lc) in the sandbox and return its exit code and output (the end of each stream when long). The command starts in the project folder and is killed after timeout_seconds (default 120).",
		Annotations: &mcp.ToolAnnotations{Title: "Run a command", OpenWorldHint: &no}}, onSandbox(s, s.run))
	mcp.AddTool(srv, &mcp.Tool{Name: "read_file", Description: "Read a file in the sandbox (at most 1 MiB; a relative path is relative to the project folder). Text comes back as is, other content as base64.",
		Annotations: &mcp.ToolAnnotations{Title: "Read a file", ReadOnlyHint: true, OpenWorldHint: &no}}, onSandbox(s, s.readFile))
	mcp.AddTool(srv, &mcp.Tool{Name: "write_file", Description: "Create or replace a file in the sandbox, with its parent folders. Files in the project folder reach the user's folder through the sync.",
		Annotations: &mcp.ToolAnnotations{Title: "Write a file", IdempotentHint: true, OpenWorldHint: &no}}, onSandbox(s, s.writeFile))
	mcp.AddTool(srv, &mcp.Tool{Name: "list_dir", Description: "List a folder in the sandbox (default: the project folder).",
		Annotations: &mcp.ToolAnnotations{Title: "List a folder", ReadOnlyHint: true, OpenWorldHint: &no}}, onSandbox(s, s.listDir))
	mcp.AddTool(srv, &mcp.Tool{Name: "checkpoint", Description: "Save the whole running machine (memory, processes, disks, project folder) to rewind to later. Cheap: take one before anything risky.",
		Annotations: &mcp.ToolAnnotations{Title: "Checkpoint", DestructiveHint: &no, OpenWorldHint: &no}}, onSandbox(s, s.checkpoint))
	mcp.AddTool(srv, &mcp.Tool{Name: "rewind", Description: "Return the machine and the project folder to a checkpoint. The state just before is saved as a checkpoint, so a rewind can be undone. Edits the user made in their folder meanwhile are kept.",
		Annotations: &mcp.ToolAnnotations{Title: "Rewind", OpenWorldHint: &no}}, onSandbox(s, s.rewind))
	mcp.AddTool(srv, &mcp.Tool{Name: "checkpoints", Description: "List the sandbox's checkpoints (a tree: each has a parent), oldest first.",
		Annotations: &mcp.ToolAnnotations{Title: "List checkpoints", ReadOnlyHint: true, OpenWorldHint: &no}}, onSandbox(s, s.checkpoints))
	mcp.AddTool(srv, &mcp.Tool{Name: "fork", Description: "Fork the running sandbox into count sandboxes (at most 8), each starting from its state now (memory, processes, files) and each keeping its changes to the project folder for the user to review: try several approaches at once and let the user apply the best. With command, each fork runs it (bash -lc) in the background; the forks tool reports how each ended and what it changed. Act on a fork with the other tools by naming it.",
		Annotations: &mcp.ToolAnnotations{Title: "Fork the sandbox", DestructiveHint: &no, OpenWorldHint: &no}}, onSandbox(s, s.fork))
	mcp.AddTool(srv, &mcp.Tool{Name: "forks", Description: "List the forks of the sandbox: each one's state, the exit code of its command, and the files and lines it changed.",
		Annotations: &mcp.ToolAnnotations{Title: "List forks", ReadOnlyHint: true, OpenWorldHint: &no}}, onSandbox(s, s.forks))
	mcp.AddTool(srv, &mcp.Tool{Name: "net_blocked", Description: "List the hosts the sandbox asked for and the network refused, with the rule that would allow each, and the rules in force.",
		Annotations: &mcp.ToolAnnotations{Title: "What the network refused", ReadOnlyHint: true, OpenWorldHint: &no}}, onSandbox(s, s.netBlocked))
	mcp.AddTool(srv, &mcp.Tool{Name: "net_request_approval", Description: "Ask the user to allow a host for the sandbox. This never allows anything by itself: the request is recorded and shown to the user, who decides and runs the command this returns. Tell the user why you need the host.",
		Annotations: &mcp.ToolAnnotations{Title: "Ask the user to allow a host", DestructiveHint: &no, OpenWorldHint: &no}}, onSandbox(s, s.netRequestApproval))
	return srv, s
}

// SandboxArg names the sandbox a tool acts on.
type SandboxArg struct {
	Sandbox string `json:"sandbox,omitempty" jsonschema:"the sandbox's name, one this session created or picked (default: the one sandbox_create_or_pick returned last)"`
}

func (a SandboxArg) sandboxName() string { return a.Sandbox }

// named is a tool input with a SandboxArg.
type named interface{ sandboxName() string }

// onSandbox adapts a tool that acts on one sandbox to the SDK's handler:
// the input's sandbox, or the one picked, is opened first.
func onSandbox[In named, Out any](s *mcpServer, f func(context.Context, *sdk.Sandbox, In) (Out, error)) mcp.ToolHandlerFor[In, Out] {
	return func(ctx context.Context, _ *mcp.CallToolRequest, in In) (*mcp.CallToolResult, Out, error) {
		sb, err := s.sandbox(in.sandboxName())
		if err != nil {
			var zero Out
			return nil, zero, err
		}
		out, err := f(ctx, sb, in)
		return nil, out, err
	}
}

// sandbox opens the named sandbox, or the one picked, if the session may
// act on it (access.Scope.Check: one it created or picked, by identity,
// whose folder is within the roots).
func (s *mcpServer) sandbox(name string) (*sdk.Sandbox, error) {
	if name == "" {
		s.mu.Lock()
		name = s.current
		s.mu.Unlock()
	}
	if name == "" {
		return nil, errors.New("no sandbox picked: call sandbox_create_or_pick with the project folder first")
	}
	sb, err := s.c.Open(name)
	if err != nil {
		return nil, err
	}
	if err := s.scope.Check(target(sb)); err != nil {
		s.log.Warn("refused a sandbox outside the session's", "sandbox", name, "err", err)
		return nil, err
	}
	return sb, nil
}

// give lets the session act on the sandboxes the user named (kosa8 mcp
// --sandbox), as if it had picked them; the first is the current one.
func (s *mcpServer) give(names []string) error {
	for i, n := range names {
		sb, err := s.c.Open(n)
		if err != nil {
			return fmt.Errorf("--sandbox %s: %w", n, err)
		}
		if err := s.scope.Grant(target(sb)); err != nil {
			return fmt.Errorf("--sandbox %s: %w", n, err)
		}
		if i == 0 {
			s.current = sb.Name()
		}
	}
	return nil
}

// target is what access reads of sb.
func target(sb *sdk.Sandbox) access.Target {
	i := sb.Info()
	return access.Target{ID: i.ID, Name: i.Name, Workspace: i.Workspace}
}

// PickIn is sandbox_create_or_pick's input.
type PickIn struct {
	Folder string `json:"folder" jsonschema:"the project folder on the user's machine, an absolute path"`
	Name   string `json:"name,omitempty" jsonschema:"a name for a new sandbox (default: the folder's name and a random suffix)"`
	CPUs   int    `json:"cpus,omitempty" jsonschema:"virtual CPUs for a new sandbox (default 2)"`
	Memory string `json:"memory,omitempty" jsonschema:"memory for a new sandbox, e.g. 4G (default 1G)"`
}

// PickOut describes the sandbox picked.
type PickOut struct {
	Sandbox   string   `json:"sandbox"`
	Created   bool     `json:"created"`
	Started   bool     `json:"started"`
	Workspace string   `json:"workspace"`
	Accel     string   `json:"accel,omitempty"`
	Network   []string `json:"network_rules"`
	Note      string   `json:"note,omitempty"`
}

func (s *mcpServer) createOrPick(ctx context.Context, _ *mcp.CallToolRequest, in PickIn) (*mcp.CallToolResult, PickOut, error) {
	var out PickOut
	if !filepath.IsAbs(in.Folder) {
		return nil, out, fmt.Errorf("folder %q is not an absolute path", in.Folder)
	}
	// The folder as the file system reads it (links before ".."): this
	// path, and no other reading of in.Folder, is checked and used.
	f, err := folder.Resolve(in.Folder)
	if err != nil {
		return nil, out, err
	}
	if err := s.scope.Folder(f); err != nil {
		s.log.Warn("refused a folder outside the allowed ones", "folder", in.Folder, "err", err)
		return nil, out, err
	}
	list, err := s.c.ForFolder(ctx, f.String())
	if err != nil {
		return nil, out, err
	}
	var sb *sdk.Sandbox
	if len(list) > 0 {
		sb, err = s.c.Open(list[0].Name)
	} else {
		sb, err = s.c.Create(ctx, sdk.CreateOptions{Name: in.Name, Workspace: f.String(), CPUs: in.CPUs, Memory: in.Memory})
		out.Created = true
	}
	if err != nil {
		return nil, out, err
	}
	// The capability: this session may act on this sandbox (by identity)
	// from now on, its folder checked once more as recorded.
	if err := s.scope.Grant(target(sb)); err != nil {
		return nil, out, err
	}
	if sb.Info().State != sdk.Running {
		s.log.Info("starting sandbox", "sandbox", sb.Name())
		if err := sb.Start(ctx); err != nil {
			return nil, out, err
		}
		out.Started = true
	}
	s.mu.Lock()
	s.current = sb.Name()
	s.mu.Unlock()
	info := sb.Info()
	out.Sandbox, out.Workspace, out.Accel = info.Name, info.Workspace, info.Accel
	if out.Network, err = sb.Rules(ctx); err != nil {
		return nil, out, err
	}
	if len(out.Network) == 0 {
		out.Note = "the network is closed: no host is allowed"
	}
	if info.Accel == "tcg" {
		out.Note = strings.TrimPrefix(out.Note+"; the sandbox runs without hardware acceleration (slow)", "; ")
	}
	return nil, out, nil
}

// RunIn is run's input.
type RunIn struct {
	SandboxArg
	Command        string `json:"command" jsonschema:"a shell command line, run with bash -lc"`
	TimeoutSeconds int    `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds (default 120, at most 3600)"`
	Workdir        string `json:"workdir,omitempty" jsonschema:"working directory in the sandbox (default: the project folder)"`
}

// RunOut is how a command ended.
type RunOut struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	Signal    string `json:"signal,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	Millis    int64  `json:"duration_ms"`
}

// mcpOutput bounds what run returns of each stream: a model reads it all.
const mcpOutput = 48 << 10

func (s *mcpServer) run(ctx context.Context, sb *sdk.Sandbox, in RunIn) (RunOut, error) {
	var out RunOut
	if strings.TrimSpace(in.Command) == "" {
		return out, errors.New("no command given")
	}
	timeout := time.Duration(in.TimeoutSeconds) * time.Second
	switch {
	case in.TimeoutSeconds <= 0:
		timeout = 120 * time.Second
	case in.TimeoutSeconds > 3600:
		timeout = time.Hour
	}
	stdout, stderr := newHeadTail(mcpOutput), newHeadTail(mcpOutput)
	res, err := sb.Exec(ctx, sdk.Cmd{Args: []string{"bash", "-lc", in.Command}, Dir: in.Workdir, Stdout: stdout, Stderr: stderr, Timeout: timeout})
	if err != nil {
		return out, err
	}
	out = RunOut{ExitCode: res.ExitCode, Stdout: stdout.String(), Stderr: stderr.String(), TimedOut: res.TimedOut, Signal: res.Signal,
		Truncated: stdout.cut > 0 || stderr.cut > 0, Millis: res.Duration.Milliseconds()}
	return out, nil
}

// headTail keeps the first and the last bytes of a stream, and counts
// what it dropped in between.
type headTail struct {
	head, tail []byte
	max        int
	cut        int64
}

func newHeadTail(max int) *headTail { return &headTail{max: max} }

func (h *headTail) Write(p []byte) (int, error) {
	n := len(p)
	if room := h.max/4 - len(h.head); room > 0 {
		k := min(room, len(p))
		h.head = append(h.head, p[:k]...)
		p = p[k:]
	}
	h.tail = append(h.tail, p...)
	if keep := h.max - h.max/4; len(h.tail) > keep {
		h.cut += int64(len(h.tail) - keep)
		h.tail = append(h.tail[:0], h.tail[len(h.tail)-keep:]...)
	}
	return n, nil
}

func (h *headTail) String() string {
	s := string(h.head)
	if h.cut > 0 {
		s += fmt.Sprintf("\n[... %d bytes cut ...]\n", h.cut)
	}
	return strings.ToValidUTF8(s+string(h.tail), "\uFFFD")
}

// PathIn names a path in the sandbox.
type PathIn struct {
	SandboxArg
	Path string `json:"path" jsonschema:"a path in the sandbox; relative to the project folder unless absolute"`
}

// ReadOut is a file's content.
type ReadOut struct {
	Path     string `json:"path"`
	Size     int    `json:"size"`
	Encoding string `json:"encoding"` // utf-8 or base64
	Content  string `json:"content"`
}

// mcpMaxRead bounds read_file: the content goes into the model's context.
const mcpMaxRead = 1 << 20

func (s *mcpServer) readFile(ctx context.Context, sb *sdk.Sandbox, in PathIn) (ReadOut, error) {
	var out ReadOut
	b, err := sb.ReadFile(ctx, in.Path)
	if err != nil {
		return out, err
	}
	if len(b) > mcpMaxRead {
		return out, fmt.Errorf("%s is %d bytes, more than read_file returns (1 MiB): use run with head, tail, sed or grep", in.Path, len(b))
	}
	out = ReadOut{Path: in.Path, Size: len(b), Encoding: "utf-8", Content: string(b)}
	if !utf8.Valid(b) {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(b)
	}
	return out, nil
}

// WriteIn is write_file's input.
type WriteIn struct {
	SandboxArg
	Path       string `json:"path" jsonschema:"a path in the sandbox; relative to the project folder unless absolute"`
	Content    string `json:"content" jsonschema:"the file's whole new content"`
	Base64     bool   `json:"base64,omitempty" jsonschema:"content is base64 (for binary files)"`
	Executable bool   `json:"executable,omitempty" jsonschema:"make the file executable (mode 755 instead of 644)"`
}

// WriteOut confirms a write.
type WriteOut struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

func (s *mcpServer) writeFile(ctx context.Context, sb *sdk.Sandbox, in WriteIn) (WriteOut, error) {
	var out WriteOut
	data := []byte(in.Content)
	if in.Base64 {
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return out, fmt.Errorf("content is not base64: %w", err)
		}
	}
	perm := os.FileMode(0o644)
	if in.Executable {
		perm = 0o755
	}
	if err := sb.WriteFile(ctx, in.Path, data, perm); err != nil {
		return out, err
	}
	return WriteOut{Path: in.Path, Bytes: len(data)}, nil
}

// ListIn is list_dir's input.
type ListIn struct {
	SandboxArg
	Path string `json:"path,omitempty" jsonschema:"a folder in the sandbox (default: the project folder)"`
}

// ListOut is a folder's entries.
type ListOut struct {
	Path    string         `json:"path"`
	Entries []sdk.FileInfo `json:"entries"`
}

func (s *mcpServer) listDir(ctx context.Context, sb *sdk.Sandbox, in ListIn) (ListOut, error) {
	var out ListOut
	if in.Path == "" {
		in.Path = "."
	}
	list, err := sb.ListDir(ctx, in.Path)
	if err != nil {
		return out, err
	}
	return ListOut{Path: in.Path, Entries: list}, nil
}

// CheckpointIn is checkpoint's input.
type CheckpointIn struct {
	SandboxArg
	Message string `json:"message,omitempty" jsonschema:"what this checkpoint is, e.g. before the migration"`
}

func (s *mcpServer) checkpoint(ctx context.Context, sb *sdk.Sandbox, in CheckpointIn) (*sdk.Checkpoint, error) {
	return sb.Checkpoint(ctx, in.Message)
}

// RewindIn is rewind's input.
type RewindIn struct {
	SandboxArg
	ID string `json:"id" jsonschema:"the checkpoint's id"`
}

func (s *mcpServer) rewind(ctx context.Context, sb *sdk.Sandbox, in RewindIn) (*sdk.RewindResult, error) {
	return sb.Rewind(ctx, in.ID)
}

// CheckpointsOut lists checkpoints.
type CheckpointsOut struct {
	Checkpoints []sdk.Checkpoint `json:"checkpoints"`
}

func (s *mcpServer) checkpoints(ctx context.Context, sb *sdk.Sandbox, in SandboxArg) (CheckpointsOut, error) {
	list, err := sb.Checkpoints(ctx)
	return CheckpointsOut{Checkpoints: list}, err
}

// ForkIn is fork's input.
type ForkIn struct {
	SandboxArg
	Count   int    `json:"count" jsonschema:"how many forks, 1 to 8"`
	Command string `json:"command,omitempty" jsonschema:"a shell command line each fork runs (bash -lc) in its project folder, in the background"`
}

// ForkOut names the forks made.
type ForkOut struct {
	Forks []string `json:"forks"`
	Note  string   `json:"note"`
}

// mcpMaxForks bounds what a model may fork at once (the CLI allows 64).
const mcpMaxForks = 8

func (s *mcpServer) fork(ctx context.Context, sb *sdk.Sandbox, in ForkIn) (ForkOut, error) {
	if in.Count < 1 || in.Count > mcpMaxForks {
		return ForkOut{}, fmt.Errorf("count %d: fork into 1 to %d", in.Count, mcpMaxForks)
	}
	var opts []sdk.ForkOption
	if strings.TrimSpace(in.Command) != "" {
		opts = append(opts, sdk.ForkCommand("bash", "-lc", in.Command))
	}
	forks, err := sb.Fork(ctx, in.Count, opts...)
	out := ForkOut{Forks: []string{}, Note: "each fork keeps its changes to the project folder for the user's review ('kosa8 diff', 'kosa8 apply')"}
	for _, f := range forks {
		// Made by this session: it may act on them, as on a sandbox it created.
		if gerr := s.scope.Grant(target(f)); gerr != nil {
			s.log.Warn("a fork the session made is outside its scope", "fork", f.Name(), "err", gerr)
			continue
		}
		out.Forks = append(out.Forks, f.Name())
	}
	if err != nil && len(forks) == 0 {
		return out, err
	}
	if err != nil {
		out.Note = err.Error() + "; " + out.Note
	}
	return out, nil
}

// ForksOut lists forks.
type ForksOut struct {
	Forks []sdk.ForkStatus `json:"forks"`
}

func (s *mcpServer) forks(ctx context.Context, sb *sdk.Sandbox, in SandboxArg) (ForksOut, error) {
	list, err := s.c.Forks(ctx, sb.Name())
	return ForksOut{Forks: list}, err
}

// BlockedOut is what the network refused.
type BlockedOut struct {
	Blocked []sdk.Blocked `json:"blocked"`
	Rules   []string      `json:"rules_in_force"`
}

func (s *mcpServer) netBlocked(ctx context.Context, sb *sdk.Sandbox, in SandboxArg) (BlockedOut, error) {
	var out BlockedOut
	var err error
	if out.Blocked, err = sb.Blocked(ctx); err != nil {
		return out, err
	}
	out.Rules, err = sb.Rules(ctx)
	return out, err
}

// ApprovalIn is net_request_approval's input.
type ApprovalIn struct {
	SandboxArg
	Host   string `json:"host" jsonschema:"the host to allow, as net_blocked's rule: example.com, example.com:22, *.example.com, or pin:example.com for a name refused for the private address it resolved to"`
	Reason string `json:"reason" jsonschema:"why the sandbox needs it, for the user"`
}

// ApprovalOut says what happens next.
type ApprovalOut struct {
	Approved bool   `json:"approved"`
	Rule     string `json:"rule"`
	Command  string `json:"command"`
	Message  string `json:"message"`
}

func (s *mcpServer) netRequestApproval(ctx context.Context, sb *sdk.Sandbox, in ApprovalIn) (ApprovalOut, error) {
	var out ApprovalOut
	req, err := sb.RequestNetAccess(ctx, in.Host, in.Reason)
	if err != nil {
		return out, err
	}
	// The user sees this in the client's MCP log; the request is also kept
	// in the sandbox's state directory.
	fmt.Fprintf(os.Stderr, "kosa8: the model asks to allow %s for sandbox %s (%s); to allow it run: %s\n",
		req.Rule, sb.Name(), sanitize(in.Reason, false), req.Command)
	out = ApprovalOut{Rule: req.Rule, Command: req.Command,
		Message: "Not approved: this tool cannot allow hosts. The request is recorded for the user. Ask the user to review it and, if they agree, to run: " + req.Command + " — then try again."}
	return out, nil
}
