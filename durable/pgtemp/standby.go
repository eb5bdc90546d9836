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
	if _, err := os.Stat(filepath.Join(bin, "pg_basebackup")); err != nil {
		return nil, fmt.Errorf("start standby: pg_basebackup not beside postgres: %w", err)
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
	// -c fast: the backup's checkpoint is taken at once, not spread over
	// checkpoint_timeout; -X stream: the WAL written meanwhile comes along.
	bb := exec.CommandContext(ctx, filepath.Join(bin, "pg_basebackup"),
		"-D", filepath.Join(c.dir, "data"),
		"-d", fmt.Sprintf("host=%s port=%d user=postgres", primary.dir, primary.port),
		"-R", "-X", "stream", "-c", "fast", "--no-sync")
	bb.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	if out, err := bb.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_basebackup: %w: %s", err, lastLines(out, 5))
	}
	return c.serve(ctx, bin, cred, o)
}

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
