// Package pgtemp runs throwaway PostgreSQL clusters for tests, benches
// and `edged -dev`: initdb into a temporary directory, postgres as a direct
// child of this process (killed with it), a short unix-socket path, and
// every file removed on Stop. It also seeds orders into a migrated
// database (SeedOrders).
//
// It must not import package testing: bin/edged links it for -dev, and a
// production binary carries no test code (make lint checks). The helpers
// that take a *testing.T live in durable/durabletest, on top of this.
package pgtemp

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoServer is returned when no PostgreSQL server binaries are installed.
var ErrNoServer = errors.New("no PostgreSQL server binaries (initdb, postgres) found: install them with 'apt-get install postgresql'")

// Options configures a Cluster.
type Options struct {
	// TCP makes the server also listen on a free 127.0.0.1 port (fault tests
	// put a proxy in front of it). The unix socket is always on.
	TCP bool
	// Durable keeps fsync and synchronous_commit on, as production runs;
	// benchmarks want it. Off (the default), tests run faster; nothing in
	// them depends on surviving a power cut.
	Durable bool
	// MaxConnections is the server's max_connections (default 300).
	MaxConnections int
	// Port, with TCP, is the port to listen on (0: a free one), for tests
	// that point a client at a server before it exists.
	Port int
	// Settings are extra "name=value" server settings.
	Settings []string
	// BinDir, when set, is where initdb and postgres are; otherwise they
	// are searched for (see Start).
	BinDir string
}

// Cluster is one running throwaway PostgreSQL server.
type Cluster struct {
	dir     string // everything lives here: data, socket, log
	bin     string // the server binaries, for Restart
	cred    *syscall.Credential
	port    int
	tcp     bool
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	stop    sync.Once
	stopErr error
}

// dirPrefix names the cluster directories, so that Start can remove the
// ones a killed process left behind.
const dirPrefix = "nepg-"

// Start finds the server binaries, runs initdb and starts postgres, and
// returns once it accepts connections. The caller must Stop it.
func Start(ctx context.Context, o Options) (*Cluster, error) {
	bin, err := findBinDir(o.BinDir)
	if err != nil {
		return nil, err
	}
	base := shortTempDir()
	sweepStale(base)
	dir, err := os.MkdirTemp(base, dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	c := &Cluster{dir: dir, tcp: o.TCP, exited: make(chan struct{})}
	if err := c.start(ctx, bin, o); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context, bin string, o Options) error {
	if err := os.WriteFile(filepath.Join(c.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	cred, err := dropRoot(c.dir)
	if err != nil {
		return err
	}
	data := filepath.Join(c.dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w: %s", err, lastLines(out, 5))
	}
	return c.serve(ctx, bin, cred, o)
}

// serve runs postgres on the data directory under c.dir as cred (a direct
// child of this process) and waits until it accepts connections.
func (c *Cluster) serve(ctx context.Context, bin string, cred *syscall.Credential, o Options) error {
	c.bin, c.cred = bin, cred
	data := filepath.Join(c.dir, "data")
	var err error
	c.port = 5432
	listen := ""
	if o.TCP {
		if c.port = o.Port; c.port == 0 {
			if c.port, err = freePort(); err != nil {
				return err
			}
		}
		listen = "127.0.0.1"
	}
	args := []string{"-D", data, "-k", c.dir, "-p", strconv.Itoa(c.port),
		"-c", "listen_addresses=" + listen,
		"-c", "max_connections=" + strconv.Itoa(cmp.Or(o.MaxConnections, 300)),
		"-c", "shared_buffers=128MB",
		"-c", "log_min_messages=warning",
		"-c", "log_min_error_statement=panic",
	}
	if !o.Durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	for _, s := range o.Settings {
		args = append(args, "-c", s)
	}
	logf, err := os.Create(filepath.Join(c.dir, "postgres.log"))
	if err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	defer logf.Close()
	c.cmd = exec.Command(filepath.Join(bin, "postgres"), args...)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the *thread* that forked the child exits, and
		// Go may retire idle threads: pin this goroutine to its thread for
		// the child's whole life.
		runtime.LockOSThread()
		if err := c.cmd.Start(); err != nil {
			started <- err
			close(c.exited)
			return
		}
		started <- nil
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	return c.waitReady(ctx)
}

func (c *Cluster) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		select {
		case <-c.exited:
			log, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
			return fmt.Errorf("postgres exited: %v: %s", c.waitErr, lastLines(log, 10))
		case <-ctx.Done():
			return fmt.Errorf("postgres not ready: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// URL returns a connection string for database db over the unix socket.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", db, c.dir, c.port)
}

// TCPURL returns a connection string for database db at addr (the
// cluster's own TCPAddr, or a proxy in front of it).
func TCPURL(addr, db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", addr, db)
}

// TCPAddr returns the server's loopback host:port ("" unless Options.TCP).
func (c *Cluster) TCPAddr() string {
	if !c.tcp {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port))
}

// Dir returns the cluster's temporary directory (removed by Stop).
func (c *Cluster) Dir() string { return c.dir }

// Kill stops the server at once (SIGKILL to the postmaster; its backends
// exit when they notice): a crash, not a shutdown. The directory stays
// until Stop.
func (c *Cluster) Kill() {
	if c.cmd != nil && c.cmd.Process != nil {
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// Crash stops the server as a crash does, for the data: an immediate
// shutdown (SIGQUIT: every backend exits at once, nothing is checkpointed
// or flushed), so the next start runs crash recovery.
func (c *Cluster) Crash() {
	if c.cmd != nil && c.cmd.Process != nil {
		_ = c.cmd.Process.Signal(syscall.SIGQUIT)
		<-c.exited
	}
}

// Restart starts the server again on its data directory, after Crash or
// Kill, with o as Start takes it (o.Port 0 keeps a TCP server's port),
// and returns once it accepts connections.
func (c *Cluster) Restart(ctx context.Context, o Options) error {
	if c.tcp && o.Port == 0 {
		o.Port = c.port
	}
	o.TCP = c.tcp
	c.exited = make(chan struct{})
	return c.serve(ctx, c.bin, c.cred, o)
}

// Stop shuts the server down (fast shutdown, then SIGKILL after 10 s) and
// removes its directory. It is safe to call more than once.
func (c *Cluster) Stop() error {
	c.stop.Do(func() {
		if c.cmd != nil && c.cmd.Process != nil {
			_ = c.cmd.Process.Signal(syscall.SIGINT)
			select {
			case <-c.exited:
			case <-time.After(10 * time.Second):
				_ = c.cmd.Process.Kill()
				<-c.exited
			}
		}
		c.stopErr = os.RemoveAll(c.dir)
	})
	return c.stopErr
}

// findBinDir locates initdb and postgres: the explicit directory, or PATH, then pg_config --bindir,
// then the newest /usr/lib/postgresql/*/bin (Debian keeps them there).
func findBinDir(explicit string) (string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres"} {
			if st, err := os.Stat(filepath.Join(dir, b)); err != nil || st.IsDir() {
				return false
			}
		}
		return true
	}
	if explicit != "" {
		if has(explicit) {
			return explicit, nil
		}
		return "", fmt.Errorf("%s: %w", explicit, ErrNoServer)
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
		if has(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); has(d) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	return "", ErrNoServer
}

func pgVersion(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// dropRoot returns the credential to run the server with: initdb and
// postgres refuse to run as root, so as root they run as the "postgres"
// user (Debian's packages create it), owning the cluster directory.
func dropRoot(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root needs the 'postgres' user to own the throwaway cluster: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, fmt.Errorf("chown cluster dir: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("chmod cluster dir: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// shortTempDir keeps the socket path under the 107-byte limit.
func shortTempDir() string {
	if d := os.TempDir(); len(d) <= 40 {
		return d
	}
	return "/tmp"
}

// sweepStale removes cluster directories whose owning process is gone (a
// test binary killed by -timeout or SIGKILL cannot clean up after itself).
func sweepStale(base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, dirPrefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(string(b))
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) == nil || errors.Is(syscall.Kill(pid, 0), syscall.EPERM) {
			continue
		}
		_ = os.RemoveAll(d)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(b []byte, n int) string {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte(" | ")))
}

// BinDir returns the directory of the PostgreSQL server binaries the
// clusters here start (as Start finds them), for programs that start a
// server of their own (Patroni's bin_dir).
func BinDir() (string, error) { return findBinDir("") }
