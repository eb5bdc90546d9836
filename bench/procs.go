package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"
)

// Running the stack's processes: starting one with its log, killing it,
// waiting for an address to answer, free loopback addresses.

// scaleProc is a child process of ours.
type scaleProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// startProc starts a child of ours (killed with us), its output in a file
// of the run's directory.
func (st *scaleStack) startProc(name, bin string, args, env []string) (*scaleProc, error) {
	return startChild(st.dir, name, bin, args, env, nil)
}

// startChild starts a child of ours (killed with us; a process it starts
// in turn is not, as Patroni's Postgres), its output in dir/name.log, as
// the user cred names (nil: as we run).
func startChild(dir, name, bin string, args, env []string, cred *syscall.Credential) (*scaleProc, error) {
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	p := &scaleProc{name: name, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig follows the forking thread: keep it for the child's life.
		runtime.LockOSThread()
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
		if err := cmd.Start(); err != nil {
			started <- err
			close(p.done)
			return
		}
		p.cmd = cmd
		started <- nil
		cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

// kill SIGKILLs the process and waits for it.
func (p *scaleProc) kill() {
	if p != nil && p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitStatus waits until url answers 200.
func waitStatus(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer 200 within %s", url, timeout)
}

// freeAddr returns a free 127.0.0.1 address.
func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic("bench: no free port: " + err.Error())
	}
	defer l.Close()
	return l.Addr().String()
}
