// Package claimcachetest runs a real redis-server for tests and benches: on
// a free loopback port, as a direct child of this process (killed with it),
// without persistence, stopped by PID. WaitFor waits for a test's condition
// with a deadline fit for a loaded machine.
package claimcachetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNoServer is returned when redis-server is not installed.
var ErrNoServer = errors.New("redis-server not found: install it with 'apt-get install redis-server'")

// Server is one running redis-server.
type Server struct {
	port   int
	dir    string
	args   []string
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// Start runs redis-server on a free 127.0.0.1 port with the extra
// "--name value" arguments given, and returns once it answers PING. A port
// found free may be taken before the server binds it (by a server another
// test starts, or, for a cluster node's bus at port+10000, by any outgoing
// connection): a server that exits at start is started again on another
// port, a few times.
func Start(extra ...string) (*Server, error) {
	var err error
	for range startAttempts {
		var s *Server
		if s, err = startOnce(extra); err == nil || !errors.Is(err, errExitedAtStart) {
			return s, err
		}
	}
	return nil, err
}

// startAttempts bounds Start's tries.
const startAttempts = 5

// errExitedAtStart is a server that exited before it answered PING: on a
// port found free, most likely one taken meanwhile.
var errExitedAtStart = errors.New("redis-server exited at start")

// freePort finds a free loopback port (a variable: the retry's test hands
// out a taken one first).
var freePort = func() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startOnce(extra []string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	// Its own directory: an AOF or RDB file must never outlive the test, or
	// land where the next server would load it.
	dir, err := os.MkdirTemp("", "neredis-")
	if err != nil {
		return nil, err
	}
	s := &Server{port: port, dir: dir, args: append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "no",
		"--protected-mode", "no", "--loglevel", "warning",
	}, extra...)}
	if err := s.start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) start() error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return ErrNoServer
	}
	cmd := exec.Command(bin, s.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		// Pdeathsig follows the forking thread: keep it for the child's life.
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(exited)
			return
		}
		started <- nil
		cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if s.ping() == nil {
			return nil
		}
		select {
		case <-exited:
			return errExitedAtStart
		case <-time.After(10 * time.Millisecond):
		}
	}
	return errors.New("redis-server did not answer PING within 10 s")
}

// ping sends an inline PING.
func (s *Server) ping() error {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("ping: %q %v", line, err)
	}
	return nil
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is the redis:// URL of the server.
func (s *Server) URL() string { return "redis://" + s.Addr() + "/0" }

// Kill stops the server at once (SIGKILL): a crash, not a shutdown.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Restart starts the server again on the same port: empty, unless it was
// started with persistence (then with what it had written).
func (s *Server) Restart(ctx context.Context) error {
	s.Kill()
	var err error
	for ctx.Err() == nil {
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond) // the port may linger briefly
	}
	return fmt.Errorf("restart redis-server: %w (%w)", ctx.Err(), err)
}

// Pause stops the server process (SIGSTOP): it holds its connections but
// reads and answers nothing until Resume.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = cmd.Process.Signal(sig)
	}
}

// alive reports whether the server process is running.
func (s *Server) alive() bool {
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	if exited == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// Stop kills the server and removes its directory; safe to call more than
// once.
func (s *Server) Stop() {
	s.Kill()
	os.RemoveAll(s.dir)
}
