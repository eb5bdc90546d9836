package pgtemp

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/jackc/pgx/v5"
)

// StartStandby starts a streaming standby of primary: pg_basebackup copies
// it (with -R, which writes standby.signal and a primary_conninfo over the
// primary's unix socket; initdb's trust rules let the replication
// connection in), then postgres runs on the copy as Start runs it, a hot
// standby that takes read-only connections until Promote. o configures the
// standby's own server as in Start (its Settings are not the primary's).
// The caller must Stop it; stopping the primary first leaves it running,
// its walreceiver retrying, until promoted.
func StartStandby(ctx context.Context, primary *Cluster, o Options) (*Cluster, error) {
	bin, err := findBinDir(o.BinDir)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(shortTempDir(), dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("start standby: %w", err)
	}
	c := &Cluster{dir: dir, tcp: o.TCP, exited: make(chan struct{})}
	if err := c.startStandby(ctx, bin, primary, o); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) startStandby(ctx context.Context, bin string, primary *Cluster, o Options) error {
	if err := os.WriteFile(filepath.Join(c.dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return fmt.Errorf("start standby: %w", err)
	}
	// The copy must belong to the user postgres runs as, so pg_basebackup
	// runs as that user too.
	cred, err := dropRoot(c.dir)
	if err != nil {
		return err
	}
	if err := baseBackup(ctx, bin, cred, c.dir, primary, "-R"); err != nil {
		return err
	}
	return c.serve(ctx, bin, cred, o)
}

// baseBackup copies primary into dir/data as cred with pg_basebackup and
// the extra arguments. -c fast: the backup's checkpoint is taken at once,
// not spread over checkpoint_timeout; -X stream: the WAL written meanwhile
// comes along.
func baseBackup(ctx context.Context, bin string, cred *syscall.Credential, dir string, primary *Cluster, extra ...string) error {
	if _, err := os.Stat(filepath.Join(bin, "pg_basebackup")); err != nil {
		return fmt.Errorf("base backup: pg_basebackup not beside postgres: %w", err)
	}
	args := append([]string{"-D", filepath.Join(dir, "data"),
		"-d", fmt.Sprintf("host=%s port=%d user=postgres", primary.dir, primary.port),
		"-X", "stream", "-c", "fast", "--no-sync"}, extra...)
	bb := exec.CommandContext(ctx, filepath.Join(bin, "pg_basebackup"), args...)
	bb.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if out, err := bb.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_basebackup: %w: %s", err, lastLines(out, 5))
	}
	return nil
}

// Backup is a base backup of a running cluster, kept until it is started
// (Start) or removed (Remove).
type Backup struct {
	dir  string
	bin  string
	cred *syscall.Credential
}

// TakeBackup takes a base backup of primary now, as an operator's
// pg_basebackup does (the WAL written during the copy included, no
// standby configuration).
func TakeBackup(ctx context.Context, primary *Cluster) (*Backup, error) {
	bin, err := findBinDir("")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(shortTempDir(), dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("take backup: %w", err)
	}
	b := &Backup{dir: dir, bin: bin}
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		b.Remove()
		return nil, fmt.Errorf("take backup: %w", err)
	}
	if b.cred, err = dropRoot(dir); err != nil {
		b.Remove()
		return nil, err
	}
	if err := baseBackup(ctx, bin, b.cred, dir, primary); err != nil {
		b.Remove()
		return nil, err
	}
	return b, nil
}

// Start runs postgres on the backup as a primary of its own, as a database
// restored from it starts: recovery replays the backup's WAL and ends on
// the timeline it was taken on, with the system identifier of the cluster
// it copies. o configures the server as in Start. The returned Cluster owns
// the backup's directory; Stop it.
func (b *Backup) Start(ctx context.Context, o Options) (*Cluster, error) {
	c := &Cluster{dir: b.dir, tcp: o.TCP, exited: make(chan struct{})}
	if err := c.serve(ctx, b.bin, b.cred, o); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Remove deletes a backup that was not started.
func (b *Backup) Remove() error { return os.RemoveAll(b.dir) }

// Promote promotes a standby and returns once it takes writes
// (pg_promote with wait). The end-of-recovery checkpoint may still be
// running then: it is a spread one.
func (c *Cluster) Promote(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return fmt.Errorf("promote: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_promote(wait => true, wait_seconds => 60)`).Scan(&ok); err != nil {
		return fmt.Errorf("promote: %w", err)
	}
	if !ok {
		return fmt.Errorf("promote: not promoted within 60 s")
	}
	return nil
}
