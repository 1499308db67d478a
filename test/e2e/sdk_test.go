package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sdkEnv is the environment of a program that uses the SDK or the Python
// client against this run's state directory, finding kosa8 on PATH.
func sdkEnv() []string {
	return append(os.Environ(), "KOSA8_E2E=1", "KOSA8_HOME="+home, "KOSA8_CONFIG="+filepath.Join(home, "config"),
		"PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// TestSDKExamples runs the Go SDK's examples: each boots a sandbox and
// its printed output is checked by go test against the example's Output.
func TestSDKExamples(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-v", "-timeout", "19m", "-run", "^Example", "./sdk/")
	cmd.Dir = "../.."
	cmd.Env = sdkEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the SDK's examples failed: %v\n%s", err, out)
	}
	for _, name := range []string{"Example", "Example_checkpoint", "Example_network"} {
		if !strings.Contains(string(out), "--- PASS: "+name+" ") {
			t.Errorf("example %s did not run and pass:\n%s", name, out)
		}
	}
	t.Logf("%s", out)
}

// TestPythonClient runs the Python client's VM test: a sandbox created,
// started, used and removed from Python.
func TestPythonClient(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed on this host")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "-m", "unittest", "-v", "tests.test_vm")
	cmd.Dir = "../../python"
	cmd.Env = append(sdkEnv(), "KOSA8_BIN="+binDir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 -m unittest tests.test_vm: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "skipped") || !strings.Contains(string(out), "OK") {
		t.Fatalf("the Python VM test did not run:\n%s", out)
	}
	t.Logf("%s", out)
}
