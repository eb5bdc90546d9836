package main

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildEdged compiles the binary under test.
func buildEdged(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "edged")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// Point 7: `edged -dev` starts, the printed curl works verbatim, a second
// run is replayed, and on SIGINT the throwaway data directory is gone.
func TestDevModePrintedCurlWorks(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl not found: run `make deps` (or apt-get install curl)")
	}
	bin := buildEdged(t)
	cmd := exec.Command(bin, "-dev", "-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0")
	cmd.Env = cleanEnv()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := readLines(stdout)
	var dataDir, curl string
	timeout := time.After(60 * time.Second)
	for curl == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("edged exited before printing a curl command; stderr:\n%s", stderr.String())
			}
			if strings.HasPrefix(line, "curl ") {
				curl = line
				break
			}
			if strings.Contains(line, "curl") {
				t.Errorf("a line before the command names it: %q", line)
			}
			if _, rest, ok := strings.Cut(line, "throwaway cluster in "); ok {
				dataDir, _, _ = strings.Cut(rest, " ")
			}
		case <-timeout:
			t.Fatalf("no curl command within 60 s; stderr:\n%s", stderr.String())
		}
	}
	if dataDir == "" {
		t.Fatal("the banner does not say where the throwaway cluster lives")
	}
	if _, err := os.Stat(dataDir); err != nil {
		t.Fatalf("data dir %s: %v", dataDir, err)
	}
	for i, want := range []string{"", "Idempotent-Replayed: true", "Idempotent-Replayed: true"} {
		out, err := exec.Command("sh", "-c", curl).CombinedOutput()
		if err != nil {
			t.Fatalf("curl %d: %v\n%s", i+1, err, out)
		}
		text := string(out)
		if !strings.Contains(text, "HTTP/1.1 200") || !strings.Contains(text, `{"code":"SUCCESS","outcome":"applied","status":"PAID"}`) {
			t.Errorf("curl %d answered:\n%s", i+1, text)
		}
		if want != "" && !strings.Contains(text, want) {
			t.Errorf("curl %d: no %q in\n%s", i+1, want, text)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	done := waitAsync(cmd)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("edged exited with %v; stderr:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("edged did not exit within 30 s of SIGINT")
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data dir %s still there after SIGINT: %v", dataDir, err)
	}
	if strings.Contains(stderr.String(), "whsec_") {
		t.Error("a secret reached the logs")
	}
}

func TestProductionNeedsDatabaseURL(t *testing.T) {
	bin := buildEdged(t)
	cmd := exec.Command(bin)
	cmd.Env = append(cleanEnv(), "EDGE_SECRET_ACME=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("edged without DATABASE_URL: err %v, want a non-zero exit", err)
	}
	if !strings.Contains(string(out), "DATABASE_URL") || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Errorf("want one line naming DATABASE_URL, got:\n%s", out)
	}
}

// cleanEnv is the environment without any notifyedge configuration.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "EDGE_") && !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "REDIS_URL=") {
			env = append(env, kv)
		}
	}
	return env
}

// readLines delivers r's lines on the returned channel, closed at EOF.
func readLines(r io.Reader) <-chan string {
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return lines
}

// waitAsync waits for cmd on a goroutine of its own: the caller selects
// on the result and a timeout.
func waitAsync(cmd *exec.Cmd) <-chan error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return done
}
