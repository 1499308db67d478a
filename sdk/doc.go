// Package sdk drives kosa8 sandboxes from Go: create one for a folder, run
// commands in it, move files in and out, checkpoint and rewind the whole
// machine, and change what its network may reach, without running the
// kosa8 command and parsing its text.
//
// A sandbox is a QEMU microVM with its own kernel, one workspace folder
// synced both ways with the host, a closed network that reaches only what
// its allow-list names, and checkpoints of the whole running machine. Each
// running sandbox has a supervisor process (`kosa8 supervise`) that owns its
// VM and answers an HTTP API on a unix socket in the sandbox's state
// directory; this package talks to that API, and reads and edits the state
// directory for what a stopped sandbox can answer. It starts supervisors
// exactly as the kosa8 command does, so a sandbox made here is listed,
// stopped and removed by `kosa8` as well, and the other way round.
//
// # Getting a client
//
// [New] finds the state directories the same way the kosa8 command does:
// $KOSA8_HOME (else $XDG_DATA_HOME/kosa8, else ~/.local/share/kosa8) for
// sandboxes, $KOSA8_CACHE for the guest image built by `kosa8 setup`, and
// $KOSA8_CONFIG for secrets and trust records. [WithHome] points at another
// state directory. Starting a sandbox runs the kosa8 binary: [WithBinary]
// names it, else a kosa8 next to the running program is used, else the
// one on $PATH. kosa8-agent must sit next to it (or be named by
// $KOSA8_AGENT), as `make build` leaves them.
//
//	c, err := sdk.New()
//	sb, err := c.Create(ctx, sdk.CreateOptions{Name: "demo", Workspace: "/home/me/project", Allow: []string{"pypi.org"}})
//	err = sb.Start(ctx)
//	res, err := sb.Exec(ctx, sdk.Cmd{Args: []string{"make", "test"}, Stdout: os.Stdout, Stderr: os.Stderr, Timeout: 10 * time.Minute})
//	fmt.Println("exit code", res.ExitCode)
//	err = sb.Stop(ctx)
//
// # Sandboxes
//
// [Client.Create] makes a stopped sandbox; [Sandbox.Start] boots it and
// returns once its guest answers (a paused sandbox continues where it
// was). [Sandbox.Stop] powers it off, [Client.Remove] deletes it and
// everything it holds, [Client.List] lists them all with their state, and
// [Client.Open] returns the handle of an existing one. [Client.ForFolder]
// finds the sandboxes whose workspace is a given folder.
//
// # Commands
//
// [Sandbox.Exec] runs a command and streams its standard output and error
// to the writers given, as they come; it returns the exit code. A [Cmd]
// with a Timeout (or a ctx that ends) kills the command's process group in
// the guest and reports TimedOut. [Sandbox.Output] is the short form that
// returns standard output and fails on a non-zero exit. For a person at a
// terminal, or an agent driving an interactive program, a Cmd with TTY runs
// the command on a terminal in the guest, of the Size given and resized by
// what is sent on Resize; Signals forwards signals (the channel given to
// signal.Notify will do) to the command, with or without one. Commands run as the
// sandbox's user (your user name and ids; root on the host maps to kosa8,
// uid 1000), with passwordless sudo, in the workspace folder unless Dir
// says otherwise.
//
// # Files
//
// [Sandbox.ReadFile], [Sandbox.WriteFile] and [Sandbox.ListDir] work on the
// guest's file system, as the sandbox's user; a relative path is relative
// to the workspace folder (the user's home without one). A file written in
// the workspace reaches the host folder through the sync, within about a
// second (files host tools run or obey, such as .envrc or .git/hooks, are
// held for approval instead; [Sandbox.SyncStatus] lists them).
//
// # Checkpoints
//
// [Sandbox.Checkpoint] saves the whole running machine (memory, processes,
// disks and the workspace) in well under a second of pause; [Sandbox.Rewind]
// returns to one, after saving the state just before as a checkpoint of
// its own, so a rewind can be undone. [Sandbox.Checkpoints] lists them with
// their parents and sizes. [Sandbox.Pause] writes the machine out and frees
// its memory; [Sandbox.Resume] continues it.
//
// # Forks
//
// [Sandbox.Fork] makes n sandboxes of the running machine (one checkpoint
// of it, then n starts from it): best-of-n attempts at one task, each with
// its own disks, network stack and identity, each keeping its changes to
// the workspace for review. [ForkCommand] runs a command in each, detached
// (its exit status in [Sandbox.ForkStatus]); [Client.Forks] reports every
// fork of a sandbox with what it changed ([ChangeSummary]: files, lines
// added and removed); [Sandbox.ApplyChanges] on the one chosen writes its
// changes to the host folder. A sandbox cannot be removed while forks of it
// exist ([ErrHasForks]).
//
// # Network
//
// Nothing is reachable unless a rule allows it: example.com (ports 80 and
// 443), example.com:22, *.example.com, 10.0.0.0/8:5432, read:example.com
// (only GET, HEAD and git fetch). [Sandbox.Allow] and [Sandbox.Deny] change
// the rules of a running or stopped sandbox, for new connections at once;
// [Sandbox.Rules] lists them. [Sandbox.Blocked] lists the hosts the sandbox
// asked for and was refused, each with the rule that would allow it, and
// [Sandbox.NetLog] every DNS answer and connection decision;
// [Sandbox.WatchRefused] follows a running sandbox's refusals as they happen.
// [Sandbox.RequestNetAccess] records an agent's request for a host for the
// user to decide, with the command that grants it; it allows nothing. Secrets are
// bound at create ([CreateOptions].Secrets, stored with `kosa8 secret add`):
// the sandbox sees a placeholder and the real value is added on the way out.
//
// # Ports and sync
//
// [Sandbox.AddPort] forwards a host port to a port of the guest;
// [Sandbox.Ports] and [Sandbox.RemovePort] list and remove forwards.
// [Sandbox.SyncStatus] reports the workspace sync: paths waiting for review,
// held, in conflict, and the host folder's quota; [Sandbox.ApplyChanges],
// [Sandbox.ApproveChanges] and [Sandbox.DiscardChanges] write reviewed or
// held changes to the host folder, or undo them inside the sandbox.
//
// # Errors
//
// Errors say what failed and what to do. [ErrNotFound], [ErrExists],
// [ErrRunning] and [ErrNotRunning] can be tested with errors.Is; a command
// that exits non-zero in [Sandbox.Output] returns an [*ExitError].
package sdk
