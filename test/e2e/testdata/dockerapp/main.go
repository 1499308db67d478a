// Command dockerapp is the one program of the container tests
// (test/e2e/docker_test.go): built static, it is the whole image the test
// pushes to its registry (on scratch), and it also runs in the guest as a
// Testcontainers-style client of the guest's Docker.
//
//	dockerapp                      print a greeting
//	dockerapp serve ADDR NAME      HTTP: / greets as NAME; /call?url=U fetches U; /state and /set?v= hold a value in memory
//	dockerapp get URL              print URL's body; exit 1 unless it answered 2xx
//	dockerapp tc IMAGE             as Testcontainers does: start IMAGE with a published port over the Docker socket, wait for the port, connect, remove it
//	dockerapp attack URL...        from a privileged container: fetch each URL (ok or failed, never exiting), then list the machine's
//	                               block devices with their serials, each mounted with its top folder's names, the
//	                               virtio devices' types and any shared-folder mount
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Println("hello from a container")
		return
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2], os.Args[3])
	case "get":
		err = get(os.Args[2])
	case "tc":
		err = testcontainers(os.Args[2])
	case "attack":
		for _, u := range os.Args[2:] {
			if b, err := fetch(u); err != nil {
				fmt.Printf("fetch %s: failed: %v\n", u, err)
			} else {
				fmt.Printf("fetch %s: ok: %s\n", u, strings.TrimSpace(b))
			}
		}
		err = devices()
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dockerapp:", err)
		os.Exit(1)
	}
}

func serve(addr, name string) error {
	var mu sync.Mutex
	state := "orig"
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s\n", name) })
	mux.HandleFunc("/call", func(w http.ResponseWriter, r *http.Request) {
		body, err := fetch(r.URL.Query().Get("url"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		fmt.Fprintf(w, "%s got: %s", name, body)
	})
	mux.HandleFunc("/set", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		state = r.URL.Query().Get("v")
		mu.Unlock()
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/state", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, "state=%s\n", state)
	})
	return http.ListenAndServe(addr, mux)
}

func fetch(url string) (string, error) {
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return string(b), fmt.Errorf("%s: %s: %s", url, resp.Status, b)
	}
	return string(b), nil
}

func get(url string) error {
	b, err := fetch(url)
	fmt.Print(b)
	return err
}

// docker talks to the Docker Engine API on its unix socket, as
// Testcontainers' clients do.
func docker(method, path string, in any, out any) error {
	c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", "/var/run/docker.sock")
		},
	}}
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://docker"+path, body)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

func testcontainers(image string) error {
	t0 := time.Now()
	var created struct{ Id string }
	err := docker("POST", "/containers/create", map[string]any{
		"Image": image, "Cmd": []string{"serve", ":8080", "tc"},
		"ExposedPorts": map[string]any{"8080/tcp": map[string]any{}},
		"HostConfig":   map[string]any{"PortBindings": map[string]any{"8080/tcp": []map[string]string{{"HostIp": "127.0.0.1", "HostPort": ""}}}},
	}, &created)
	if err != nil {
		return err
	}
	defer docker("DELETE", "/containers/"+created.Id+"?force=1", nil, nil)
	if err := docker("POST", "/containers/"+created.Id+"/start", nil, nil); err != nil {
		return err
	}
	var info struct {
		NetworkSettings struct {
			Ports map[string][]struct{ HostIp, HostPort string }
		}
	}
	if err := docker("GET", "/containers/"+created.Id+"/json", nil, &info); err != nil {
		return err
	}
	b := info.NetworkSettings.Ports["8080/tcp"]
	if len(b) == 0 {
		return fmt.Errorf("no published port: %+v", info.NetworkSettings.Ports)
	}
	addr := net.JoinHostPort("127.0.0.1", b[0].HostPort)
	deadline := time.Now().Add(60 * time.Second)
	for {
		body, err := fetch("http://" + addr + "/")
		if err == nil && strings.Contains(body, "hello from tc") {
			fmt.Printf("testcontainers: container %.12s answered on %s after %.1fs\n", created.Id, addr, time.Since(t0).Seconds())
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the container's port %s did not answer: %v", addr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// devices prints each block device with its serial number and the names
// at the top of its filesystem (mounted read-only), and each virtio
// device's type (9 is a 9p share, 26 a virtiofs one). It looks for the
// workspace's compose.yaml and any outside-* file a few levels down.
func devices() error {
	blocks, _ := filepath.Glob("/sys/block/*")
	for _, b := range blocks {
		serial, _ := os.ReadFile(filepath.Join(b, "serial"))
		name := filepath.Base(b)
		fmt.Printf("block %s serial=%s\n", name, strings.TrimSpace(string(serial)))
		if !strings.HasPrefix(name, "vd") {
			continue
		}
		mnt := "/mnt-" + name
		os.MkdirAll(mnt, 0o755)
		// As the guest mounted it (a read-only mount of a filesystem
		// mounted read-write is refused): this program only reads.
		if err := syscall.Mount("/dev/"+name, mnt, "ext4", 0, ""); err != nil {
			fmt.Printf("  mount %s: %v\n", name, err)
			continue
		}
		ents, _ := os.ReadDir(mnt)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		fmt.Printf("  top: %s\n", strings.Join(names, " "))
		// The workspace's folder, if this is its disk.
		_ = filepath.WalkDir(mnt, func(p string, d os.DirEntry, err error) error {
			if err != nil || strings.Count(p, "/") > 4 {
				return filepath.SkipDir
			}
			if strings.HasPrefix(d.Name(), "outside-") || d.Name() == "compose.yaml" {
				fmt.Printf("  found %s\n", strings.TrimPrefix(p, mnt))
			}
			return nil
		})
		syscall.Unmount(mnt, 0)
	}
	virtio, _ := filepath.Glob("/sys/bus/virtio/devices/*/device")
	for _, v := range virtio {
		id, _ := os.ReadFile(v)
		fmt.Printf("virtio %s type=%s\n", filepath.Base(filepath.Dir(v)), strings.TrimSpace(string(id)))
	}
	mounts, _ := os.ReadFile("/proc/self/mounts")
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) > 2 && (f[2] == "9p" || f[2] == "virtiofs" || f[2] == "fuse") {
			fmt.Printf("share %s\n", l)
		}
	}
	return nil
}
