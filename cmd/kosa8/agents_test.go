package main

import (
	"archive/tar"
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/kosa8/kosa8/internal/agent"
)

func TestFilterHome(t *testing.T) {
	p, err := agent.Get("claude")
	if err != nil {
		t.Fatal(err)
	}
	var in bytes.Buffer
	tw := tar.NewWriter(&in)
	add := func(name string, typ byte, body string) {
		h := &tar.Header{Name: name, Typeflag: typ, Mode: 0o4755, Size: int64(len(body)), Linkname: "/etc/shadow"}
		if typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if typ == tar.TypeReg {
			io.WriteString(tw, body)
		}
	}
	add(".claude/", tar.TypeDir, "")
	add(".claude/settings.json", tar.TypeReg, "{}")
	add(".claude/.credentials.json", tar.TypeReg, "token")
	add("./.claude.json", tar.TypeReg, "{\"a\":1}")
	add(".ssh/id_rsa", tar.TypeReg, "key")   // not a kept path
	add("../.claude/x", tar.TypeReg, "up")   // escapes
	add(".claude/dev", tar.TypeChar, "")     // a device
	add(".claude/link", tar.TypeSymlink, "") // links travel as links (unpacked inside only)
	add(".claude/hard", tar.TypeLink, "")    // hard links do not
	tw.Close()

	var out bytes.Buffer
	res, err := filterHome(p, &in, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.held, []string{".claude/.credentials.json"}) {
		t.Fatalf("held %v", res.held)
	}
	var got []string
	tr := tar.NewReader(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Mode&^0o777 != 0 {
			t.Errorf("%s keeps mode bits %o", h.Name, h.Mode)
		}
		got = append(got, h.Name)
	}
	want := []string{".claude", ".claude/settings.json", ".claude.json", ".claude/link"}
	if !slices.Equal(got, want) {
		t.Fatalf("kept %v, want %v", got, want)
	}
}

func TestAgentFromArgs(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		dash       int
		flag, want string
		agent      string
		err        string
	}{
		{args: []string{"claude"}, dash: -1, want: "claude", agent: "claude"},
		{args: []string{"codex", "exec", "fix it"}, dash: 1, want: "codex exec fix it", agent: "codex"},
		{args: []string{"claude"}, dash: 0, want: "claude"}, // 'kosa8 run -- claude': a plain command
		{args: nil, dash: -1, flag: "gemini", want: "gemini", agent: "gemini"},
		{args: []string{"bash", "-l"}, dash: 0, flag: "claude", want: "bash -l", agent: "claude"},
		{args: []string{"nope"}, dash: -1, err: "unknown agent"},
		{args: []string{"claude", "x"}, dash: -1, err: "after --"},
		{args: []string{"claude"}, dash: -1, flag: "codex", err: "two agents"},
	} {
		a := agentFlags{name: tc.flag}
		got, err := a.fromArgs(tc.args, tc.dash)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: err %v, want %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || strings.Join(got, " ") != tc.want || a.name != tc.agent {
			t.Errorf("%v (--agent %q): got %q agent %q err %v, want %q agent %q", tc.args, tc.flag, got, a.name, err, tc.want, tc.agent)
		}
	}
}
