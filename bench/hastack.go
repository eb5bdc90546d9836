package bench

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/notifyedge/notifyedge/bench/procstat"
	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// The HA stack: Postgres as operators run it with Patroni. Three etcd
// members, three Patroni nodes each managing its own Postgres, Debian's
// haproxy routing Postgres connections to Patroni's primary and callbacks
// to the ready edged nodes, three edged, and a redis-server for the claim
// cache and the stream. The configuration files are ha/: the operator
// docs' example, filled in with loopback addresses.

//go:embed ha/etcd.yml ha/patroni.yml ha/haproxy.cfg
var haConfigs embed.FS

// haEtcd is one etcd member; its fields fill ha/etcd.yml.
type haEtcd struct {
	Name, DataDir, ClientAddr, PeerAddr, InitialCluster string
	config                                              string // the rendered file's path
	proc                                                *scaleProc
}

// haPatroni is one Patroni node; its fields fill ha/patroni.yml.
type haPatroni struct {
	Name, RestAddr, PgAddr, DataDir, Dir, BinDir, EtcdHosts string
	Synchronous                                             bool
	RestPort                                                string
	config                                                  string
	proc                                                    *scaleProc
}

// haEdged is one edged node, as ha/haproxy.cfg names it.
type haEdged struct {
	Name, Addr, AdminAddr, AdminPort string
	proc                             *scaleProc
}

// haProxyConfig fills ha/haproxy.cfg.
type haProxyConfig struct {
	PgFront, EdgeFront string
	Patroni            []*haPatroni
	Edged              []*haEdged
	// LeaveOnAnyOutage checks the edged nodes as readiness worked before
	// the nodes told a shared outage from their own: a node that cannot
	// reach Postgres leaves rotation, whatever the others can.
	LeaveOnAnyOutage bool
}

// haStack is everything RunHA started, stopped in reverse.
type haStack struct {
	dir      string
	keep     bool // leave dir in place
	progress io.Writer
	etcd     []*haEtcd
	patroni  []*haPatroni
	edged    []*haEdged
	proxy    haProxyConfig
	haproxy  *scaleProc
	redis    *claimcachetest.Server
	// dbURL reaches the primary through haproxy.
	dbURL string
	// postgresUser runs Patroni when we run as root (Postgres refuses
	// root); nil: as we run.
	postgresUser *syscall.Credential
}

// haBinaries are the programs the stack needs besides edged.
var haBinaries = []struct{ bin, pkg string }{
	{"etcd", "etcd-server"}, {"patroni", "patroni"}, {"haproxy", "haproxy"}, {"redis-server", "redis-server"},
}

// haMissing names the programs the stack needs that are not installed, with
// the Debian packages that have them.
func haMissing() error {
	var missing []string
	for _, b := range haBinaries {
		if _, err := exec.LookPath(b.bin); err != nil {
			missing = append(missing, fmt.Sprintf("%s (apt-get install %s)", b.bin, b.pkg))
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("bench: not installed: %s; make deps-ha installs them", strings.Join(missing, ", "))
	}
	return nil
}

// renderHA renders the named file of ha/ with data into path; a
// placeholder data does not fill is an error.
func renderHA(name, path string, data any) error {
	t, err := template.New(name).Option("missingkey=error").ParseFS(haConfigs, "ha/"+name)
	if err != nil {
		return fmt.Errorf("bench: ha/%s: %w", name, err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, data); err != nil {
		return fmt.Errorf("bench: ha/%s: %w", name, err)
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

// start brings the stack up: etcd, Patroni (until it has a leader, both
// replicas streaming and, in synchronous mode, a synchronous standby),
// haproxy, the schema through haproxy, Redis and the edged nodes.
func (h *haStack) start(ctx context.Context, cfg HAConfig) error {
	var err error
	if h.dir, err = os.MkdirTemp("", "neha-"); err != nil {
		return err
	}
	// Patroni runs as postgres and must reach its directory.
	if err := os.Chmod(h.dir, 0o755); err != nil {
		return err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("bench: running as root, Patroni runs as the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		h.postgresUser = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	say(h.progress, "starting 3 etcd members ...")
	if err := h.startEtcd(ctx); err != nil {
		return err
	}
	say(h.progress, "starting 3 Patroni nodes (synchronous_mode %v) ...", cfg.Synchronous)
	if err := h.startPatroni(ctx, cfg.Synchronous); err != nil {
		return err
	}
	if err := h.waitHealthy(ctx, cfg.Synchronous, 3*time.Minute); err != nil {
		return err
	}
	for i := range 3 {
		pub, adm := freeAddr(), freeAddr()
		_, admPort, _ := net.SplitHostPort(adm)
		h.edged = append(h.edged, &haEdged{Name: fmt.Sprintf("edged%d", i+1), Addr: pub, AdminAddr: adm, AdminPort: admPort})
	}
	h.proxy.PgFront, h.proxy.EdgeFront = freeAddr(), freeAddr()
	h.proxy.Patroni, h.proxy.Edged, h.proxy.LeaveOnAnyOutage = h.patroni, h.edged, cfg.LeaveOnAnyOutage
	cfgPath := filepath.Join(h.dir, "haproxy.cfg")
	if err := renderHA("haproxy.cfg", cfgPath, h.proxy); err != nil {
		return err
	}
	if h.haproxy, err = startChild(h.dir, "haproxy", "haproxy", []string{"-f", cfgPath, "-db"}, nil, nil); err != nil {
		return err
	}
	h.dbURL = pgtemp.TCPURL(h.proxy.PgFront, "postgres")
	say(h.progress, "migrating through haproxy ...")
	if err := retryFor(ctx, 30*time.Second, func() error { return durable.Migrate(ctx, h.dbURL) }); err != nil {
		return fmt.Errorf("bench: migrate through haproxy: %w", err)
	}
	if h.redis, err = claimcachetest.Start(); err != nil {
		return err
	}
	say(h.progress, "starting 3 edged behind haproxy ...")
	for _, e := range h.edged {
		if e.proc, err = startChild(h.dir, e.Name, cfg.Edged, []string{"-listen", e.Addr, "-admin-listen", e.AdminAddr, "-drain-delay", "0s"}, []string{
			"DATABASE_URL=" + h.dbURL, "REDIS_URL=" + h.redis.URL(), "EDGE_STREAM_URL=" + h.redis.URL(),
			"EDGE_SECRET_" + strings.ToUpper(Channel) + "=" + Secret}, nil); err != nil {
			return err
		}
	}
	for _, e := range h.edged {
		if err := waitStatus(ctx, "http://"+e.AdminAddr+"/readyz", time.Minute); err != nil {
			return fmt.Errorf("%s: %w", e.Name, err)
		}
	}
	return waitInRotation(ctx, "http://"+h.proxy.EdgeFront)
}

// retryFor calls f every 200 ms until it succeeds, for up to d.
func retryFor(ctx context.Context, d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		wait.Sleep(ctx, 200*time.Millisecond)
	}
}

func (h *haStack) startEtcd(ctx context.Context) error {
	var members []string
	for i := range 3 {
		e := &haEtcd{Name: fmt.Sprintf("etcd%d", i+1), DataDir: filepath.Join(h.dir, fmt.Sprintf("etcd%d", i+1)),
			ClientAddr: freeAddr(), PeerAddr: freeAddr()}
		members = append(members, e.Name+"=http://"+e.PeerAddr)
		h.etcd = append(h.etcd, e)
	}
	for _, e := range h.etcd {
		e.InitialCluster = strings.Join(members, ",")
		e.config = filepath.Join(h.dir, e.Name+".yml")
		if err := renderHA("etcd.yml", e.config, e); err != nil {
			return err
		}
		if err := h.runEtcd(e); err != nil {
			return err
		}
	}
	return retryFor(ctx, 30*time.Second, func() error {
		_, err := h.etcdLeader(ctx)
		return err
	})
}

// runEtcd starts (or restarts, on its data) one member.
func (h *haStack) runEtcd(e *haEtcd) error {
	var err error
	e.proc, err = startChild(h.dir, e.Name+"-"+time.Now().Format("150405"), "etcd", []string{"--config-file", e.config}, nil, nil)
	return err
}

func (h *haStack) etcdHosts() string {
	var hosts []string
	for _, e := range h.etcd {
		hosts = append(hosts, e.ClientAddr)
	}
	return strings.Join(hosts, ",")
}

func (h *haStack) startPatroni(ctx context.Context, synchronous bool) error {
	bin, err := pgtemp.BinDir()
	if err != nil {
		return err
	}
	for i := range 3 {
		rest := freeAddr()
		_, restPort, _ := net.SplitHostPort(rest)
		dir := filepath.Join(h.dir, fmt.Sprintf("pg%d", i+1))
		p := &haPatroni{Name: fmt.Sprintf("pg%d", i+1), RestAddr: rest, RestPort: restPort, PgAddr: freeAddr(),
			Dir: dir, DataDir: filepath.Join(dir, "data"), BinDir: bin, EtcdHosts: h.etcdHosts(), Synchronous: synchronous}
		if err := os.Mkdir(dir, 0o700); err != nil {
			return err
		}
		if h.postgresUser != nil {
			if err := os.Chown(dir, int(h.postgresUser.Uid), int(h.postgresUser.Gid)); err != nil {
				return err
			}
		}
		p.config = filepath.Join(h.dir, p.Name+".yml")
		if err := renderHA("patroni.yml", p.config, p); err != nil {
			return err
		}
		h.patroni = append(h.patroni, p)
		if err := h.runPatroni(p); err != nil {
			return err
		}
		if i == 0 {
			// The first node bootstraps the cluster (initdb) before the
			// others clone it.
			if err := h.waitMembers(ctx, time.Minute, func(ms []haMember) bool { return leaderOf(ms) != "" }); err != nil {
				return err
			}
		}
	}
	return nil
}

// runPatroni starts (or restarts) one node's Patroni, which starts its
// Postgres.
func (h *haStack) runPatroni(p *haPatroni) error {
	var err error
	p.proc, err = startChild(h.dir, p.Name+"-"+time.Now().Format("150405"), "patroni", []string{p.config},
		[]string{"HOME=" + p.Dir}, h.postgresUser)
	return err
}

// haMember is one node as Patroni's GET /cluster lists it.
type haMember struct {
	Name     string `json:"name"`
	Role     string `json:"role"` // leader, replica, sync_standby
	State    string `json:"state"`
	Timeline int    `json:"timeline"`
}

// members asks the nodes, in turn, for the cluster's members.
func (h *haStack) members(ctx context.Context) ([]haMember, error) {
	var errs []error
	for _, p := range h.patroni {
		var c struct {
			Members []haMember `json:"members"`
		}
		if err := getJSON(ctx, "http://"+p.RestAddr+"/cluster", &c); err != nil {
			errs = append(errs, err)
			continue
		}
		return c.Members, nil
	}
	return nil, errors.Join(errs...)
}

func leaderOf(ms []haMember) string {
	for _, m := range ms {
		if m.Role == "leader" && m.State == "running" {
			return m.Name
		}
	}
	return ""
}

// healthy reports whether the cluster has a running leader, two running
// replicas and, in synchronous mode, a synchronous standby.
func healthy(ms []haMember, synchronous bool) bool {
	running, sync := 0, false
	for _, m := range ms {
		if m.State == "running" || m.State == "streaming" {
			running++
		}
		sync = sync || m.Role == "sync_standby"
	}
	return leaderOf(ms) != "" && running == 3 && (sync || !synchronous)
}

func (h *haStack) waitMembers(ctx context.Context, d time.Duration, ok func([]haMember) bool) error {
	var last []haMember
	err := retryFor(ctx, d, func() error {
		ms, err := h.members(ctx)
		if err != nil {
			return err
		}
		last = ms
		if !ok(ms) {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("bench: Patroni cluster not as needed within %s (last seen %+v): %w", d, last, err)
	}
	return nil
}

func (h *haStack) waitHealthy(ctx context.Context, synchronous bool, d time.Duration) error {
	return h.waitMembers(ctx, d, func(ms []haMember) bool { return healthy(ms, synchronous) })
}

func (h *haStack) node(name string) *haPatroni {
	for _, p := range h.patroni {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// etcdLeader returns the member that leads etcd now.
func (h *haStack) etcdLeader(ctx context.Context) (*haEtcd, error) {
	var errs []error
	for _, e := range h.etcd {
		var st struct {
			Header struct {
				MemberID string `json:"member_id"`
			} `json:"header"`
			Leader string `json:"leader"`
		}
		if err := postJSON(ctx, haClient, "http://"+e.ClientAddr+"/v3/maintenance/status", `{}`, &st); err != nil {
			errs = append(errs, err)
			continue
		}
		if st.Leader != "" && st.Leader == st.Header.MemberID {
			return e, nil
		}
	}
	return nil, fmt.Errorf("bench: no etcd leader found: %w", errors.Join(errs...))
}

// postmasterPID reads the running postmaster's pid of a node (0: none).
// A killed postmaster leaves its pid file behind, and the pid may since be
// another process's: it counts only while that process's command line
// names this node's data directory.
func (p *haPatroni) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(p.DataDir, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(first))
	if pid <= 0 {
		return 0
	}
	cmd, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || !bytes.Contains(cmd, []byte(p.DataDir)) {
		return 0
	}
	return pid
}

// childPIDs finds postmaster's children whose command line holds role
// ("walsender", "walreceiver"); none without a postmaster.
func childPIDs(postmaster int, role string) []int {
	if postmaster <= 0 {
		return nil
	}
	var out []int
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if st, err := procstat.Read(pid); err != nil || st.PPID != postmaster {
			continue
		}
		if cmd, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline")); err == nil && bytes.Contains(cmd, []byte(role)) {
			out = append(out, pid)
		}
	}
	return out
}

// killNode SIGKILLs a node's Patroni and its Postgres together: Patroni
// alone killed would leave its Postgres running as a primary.
func (p *haPatroni) killNode() {
	pid := p.postmasterPID()
	if pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	p.proc.kill()
}

func (h *haStack) close() {
	h.haproxy.kill()
	for _, e := range h.edged {
		e.proc.kill()
	}
	for _, p := range h.patroni {
		p.proc.kill()
		// Patroni's Postgres outlives it: an immediate shutdown.
		if pid := p.postmasterPID(); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGQUIT)
			deadline := time.Now().Add(10 * time.Second)
			for syscall.Kill(pid, 0) == nil && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	for _, e := range h.etcd {
		e.proc.kill()
	}
	if h.redis != nil {
		h.redis.Stop()
	}
	switch {
	case h.dir != "" && h.keep:
		say(h.progress, "the run's logs and configuration: %s", h.dir)
	case h.dir != "":
		os.RemoveAll(h.dir)
	}
}

// haClient asks the nodes' state; haActions asks them to act (a
// switchover returns once it is done).
var (
	haClient  = &http.Client{Timeout: 2 * time.Second}
	haActions = &http.Client{Timeout: time.Minute}
)

func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	return doJSON(haClient, req, v)
}

// postJSON posts body to url and decodes the answer into v (nil: only its
// status); c is haClient or haActions.
func postJSON(ctx context.Context, c *http.Client, url, body string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	return doJSON(c, req, v)
}

func doJSON(c *http.Client, req *http.Request, v any) error {
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", req.Method, req.URL, resp.Status, bytes.TrimSpace(b))
	}
	if v == nil {
		return nil
	}
	return json.Unmarshal(b, v)
}
