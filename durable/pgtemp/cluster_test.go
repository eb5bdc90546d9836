package pgtemp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/notifyedge/notifyedge/durable/wait"
)

func TestStartStopRemovesEverything(t *testing.T) {
	ctx := context.Background()
	c, err := Start(ctx, Options{TCP: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	for _, url := range []string{c.URL("postgres"), TCPURL(c.TCPAddr(), "postgres")} {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatalf("connect %s: %v", url, err)
		}
		var one int
		if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
			t.Errorf("SELECT 1 = %d, %v", one, err)
		}
		conn.Close(ctx)
	}
	if n := len(filepath.Join(c.Dir(), ".s.PGSQL.65535")); n > 107 {
		t.Errorf("socket path %d bytes", n)
	}
	pid := c.cmd.Process.Pid
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dir still there: %v", err)
	}
	if alive(pid) {
		t.Errorf("postgres %d still running", pid)
	}
}

func TestNoBinariesSaysWhatToInstall(t *testing.T) {
	_, err := Start(context.Background(), Options{BinDir: t.TempDir()})
	if !errors.Is(err, ErrNoServer) || !strings.Contains(err.Error(), "apt-get install postgresql") {
		t.Fatalf("err %v, want ErrNoServer naming the package", err)
	}
}

// A test binary killed by -timeout or SIGKILL cannot run Stop: its server
// must die with it, and the next Start must remove what it left.
func TestKilledOwnerLeavesNoServer(t *testing.T) {
	if os.Getenv("PGTEMP_CHILD") == "1" {
		c, err := Start(context.Background(), Options{})
		if err != nil {
			os.Exit(3)
		}
		os.Stdout.WriteString(c.Dir() + " " + strconv.Itoa(c.cmd.Process.Pid) + "\n")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledOwnerLeavesNoServer$")
	cmd.Env = append(os.Environ(), "PGTEMP_CHILD=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		t.Fatalf("child: %v", err)
	}
	var dir string
	var pid int
	f := strings.Fields(line)
	dir = f[0]
	pid, _ = strconv.Atoi(f[1])
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	wait.For(t, "postgres to die with its killed owner", func() (bool, string) {
		return !alive(pid), fmt.Sprintf("postgres %d alive", pid)
	})
	c, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	c.Stop()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale dir %s not swept: %v", dir, err)
	}
}

func alive(pid int) bool {
	// A zombie is dead for our purpose; /proc tells them apart.
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b))
	return len(fields) > 2 && fields[2] != "Z"
}
