package sdk_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/kosa8/kosa8/sdk"
)

// These examples boot real sandboxes. `go test ./sdk` compiles them and
// runs them only when KOSA8_E2E=1 (test/e2e/sdk_test.go does, with a
// private KOSA8_HOME); see TestMain.

// Create a sandbox for a folder, run a command in it, move files in and
// out, and remove it.
func Example() {
	ctx := context.Background()
	c, err := sdk.New()
	if err != nil {
		log.Fatal(err)
	}
	project, _ := os.MkdirTemp("", "project-")
	defer os.RemoveAll(project)
	os.WriteFile(filepath.Join(project, "hello.txt"), []byte("hello from the host\n"), 0o644)

	sb, err := c.Create(ctx, sdk.CreateOptions{Name: "example", Workspace: project, Memory: "512M"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Remove(ctx, sb.Name(), true)
	if err := sb.Start(ctx); err != nil {
		log.Fatal(err)
	}

	// The folder is inside, at the same path; commands start there.
	out, err := sb.Output(ctx, "cat", "hello.txt")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(out))

	// A command's exit code is a result, not an error.
	res, err := sb.Exec(ctx, sdk.Cmd{Args: []string{"sh", "-c", "echo to stderr >&2; exit 3"}, Stderr: os.Stdout})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", res.ExitCode)

	// A time limit kills the command's process group.
	res, err = sb.Exec(ctx, sdk.Cmd{Args: []string{"sleep", "600"}, Timeout: 2 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("timed out:", res.TimedOut, res.Signal)

	// Files written inside the workspace reach the host folder.
	if err := sb.WriteFile(ctx, "notes/todo.txt", []byte("write the docs\n"), 0o644); err != nil {
		log.Fatal(err)
	}
	data, _ := sb.ReadFile(ctx, "notes/todo.txt")
	fmt.Print(string(data))
	list, _ := sb.ListDir(ctx, "notes")
	for _, f := range list {
		fmt.Println(f.Type, f.Name)
	}
	for i := 0; i < 300; i++ { // the sync takes about 0.1 s; a loaded host, longer
		if b, err := os.ReadFile(filepath.Join(project, "notes", "todo.txt")); err == nil {
			fmt.Print("on the host: ", string(b))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}

	if err := sb.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println(sb.Info().State)
	// Output:
	// hello from the host
	// to stderr
	// exit code 3
	// timed out: true SIGKILL
	// write the docs
	// file todo.txt
	// on the host: write the docs
	// stopped
}

// Checkpoint the whole machine, break something, and rewind.
func Example_checkpoint() {
	ctx := context.Background()
	c, err := sdk.New()
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.Create(ctx, sdk.CreateOptions{Name: "example-cp", Memory: "512M"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Remove(ctx, sb.Name(), true)
	if err := sb.Start(ctx); err != nil {
		log.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/tmp/state", []byte("good\n"), 0); err != nil {
		log.Fatal(err)
	}
	cp, err := sb.Checkpoint(ctx, "before the experiment")
	if err != nil {
		log.Fatal(err)
	}
	sb.Output(ctx, "sh", "-c", "echo broken > /tmp/state")
	res, err := sb.Rewind(ctx, cp.ID)
	if err != nil {
		log.Fatal(err)
	}
	out, _ := sb.Output(ctx, "cat", "/tmp/state")
	fmt.Print("after the rewind: ", string(out))
	list, _ := sb.Checkpoints(ctx)
	for _, c := range list {
		fmt.Println(c.Kind, c.ID == res.Saved.ID, c.Current)
	}
	// Output:
	// after the rewind: good
	// manual false true
	// pre-rewind true false
}

// Close the network, see what it refused, and open one host.
func Example_network() {
	ctx := context.Background()
	c, err := sdk.New()
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.Create(ctx, sdk.CreateOptions{Name: "example-net", Memory: "512M", Allow: []string{"pypi.org"}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Remove(ctx, sb.Name(), true)
	if err := sb.Start(ctx); err != nil {
		log.Fatal(err)
	}
	// A name that is not allowed leads to kosa8's refusal page, which
	// says why and what lets it through.
	page, _ := sb.Output(ctx, "curl", "-s", "http://example.com/")
	fmt.Println(strings.SplitN(string(page), "\n", 2)[0])
	blocked, _ := sb.Blocked(ctx)
	for _, b := range blocked {
		fmt.Println("refused:", b.Host, "allow with:", b.Rule)
	}
	rules, _ := sb.Allow(ctx, "example.com")
	fmt.Println(strings.Join(rules, " "))
	rules, _ = sb.Remove(ctx, "pypi.org")
	fmt.Println(strings.Join(rules, " "))
	rules, _ = sb.Deny(ctx, "evil.example.com")
	fmt.Println(strings.Join(rules, " "))
	// Output:
	// kosa8: example.com was refused: no rule allows example.com.
	// refused: example.com allow with: example.com
	// pypi.org example.com
	// example.com
	// example.com deny:evil.example.com
}

// Find the sandbox of a folder, or make one.
func ExampleClient_ForFolder() {
	ctx := context.Background()
	c, _ := sdk.New()
	list, _ := c.ForFolder(ctx, "/home/me/project")
	var sb *sdk.Sandbox
	if len(list) > 0 {
		sb, _ = c.Open(list[0].Name)
	} else {
		sb, _ = c.Create(ctx, sdk.CreateOptions{Workspace: "/home/me/project", Preset: "dev"})
	}
	if sb.Info().State != sdk.Running {
		sb.Start(ctx)
	}
}

// Stream a command's output as it comes, with a time limit.
func ExampleSandbox_Exec() {
	ctx := context.Background()
	c, _ := sdk.New()
	sb, _ := c.Open("dev")
	res, err := sb.Exec(ctx, sdk.Cmd{
		Args:    []string{"bash", "-lc", "npm ci && npm test"},
		Stdout:  os.Stdout,
		Stderr:  os.Stderr,
		Timeout: 10 * time.Minute,
	})
	if err != nil {
		log.Fatal(err) // could not run it at all
	}
	if res.TimedOut {
		fmt.Println("killed after 10 minutes")
	}
	os.Exit(res.ExitCode)
}

// Give the user a shell in the sandbox on this program's terminal, as
// `kosa8 shell` does: keys pass through raw, the window's size follows
// it, and the shell's exit status is the program's.
func ExampleSandbox_Exec_terminal() {
	ctx := context.Background()
	c, _ := sdk.New()
	sb, _ := c.Open("dev")
	in, out := int(os.Stdin.Fd()), int(os.Stdout.Fd())
	cols, rows, _ := term.GetSize(out)
	resize := make(chan sdk.WindowSize, 1)
	winch := make(chan os.Signal, 1)
	go func() {
		for range winch {
			if cols, rows, err := term.GetSize(out); err == nil {
				resize <- sdk.WindowSize{Rows: uint16(rows), Cols: uint16(cols)}
			}
		}
	}()
	var restore func()
	res, err := sb.Exec(ctx, sdk.Cmd{
		Args:   []string{"bash", "-l"},
		Env:    []string{"TERM=" + os.Getenv("TERM")},
		TTY:    true,
		Size:   sdk.WindowSize{Rows: uint16(rows), Cols: uint16(cols)},
		Resize: resize,
		Stdin:  os.Stdin,
		Stdout: os.Stdout,
		// Raw once the shell runs: until then ^C interrupts this program.
		Started: func(int) {
			if old, err := term.MakeRaw(in); err == nil {
				restore = func() { term.Restore(in, old) }
			}
			signal.Notify(winch, syscall.SIGWINCH)
		},
	})
	signal.Stop(winch)
	if restore != nil {
		restore()
	}
	if err != nil {
		log.Fatal(err)
	}
	os.Exit(res.ExitCode)
}

// Forward the signals this program gets (^C, a kill) to a command run
// without a terminal, as `kosa8 exec` does.
func ExampleCmd_signals() {
	ctx := context.Background()
	c, _ := sdk.New()
	sb, _ := c.Open("dev")
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	res, err := sb.Exec(ctx, sdk.Cmd{Args: []string{"make", "test"}, Stdout: os.Stdout, Stderr: os.Stderr, Signals: sigs})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("exit code", res.ExitCode) // 130 when ^C ended it
}

// Forward a host port to a server in the sandbox.
func ExampleSandbox_AddPort() {
	ctx := context.Background()
	c, _ := sdk.New()
	sb, _ := c.Open("dev")
	if err := sb.AddPort(ctx, sdk.Port{HostPort: 8080, GuestPort: 3000}); err != nil {
		log.Fatal(err)
	}
	ports, _ := sb.Ports(ctx)
	fmt.Println(ports)
}

// Pause a sandbox to free its memory; resume it later where it was.
func ExampleSandbox_Pause() {
	ctx := context.Background()
	c, _ := sdk.New()
	sb, _ := c.Open("dev")
	if err := sb.Pause(ctx); err != nil {
		log.Fatal(err)
	}
	// ... later, even after the program restarted:
	if err := sb.Resume(ctx); err != nil {
		log.Fatal(err)
	}
}
