package bench

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	osexec "os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/notifyedge/notifyedge/bench/procstat"
	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/pgtemp"
	"github.com/notifyedge/notifyedge/edge/channel/channeltest"
	"github.com/notifyedge/notifyedge/edge/reconcile/bill"
	"github.com/notifyedge/notifyedge/edge/reconcile/bill/billtest"
	"github.com/notifyedge/notifyedge/edge/reconcile/query/querytest"
)

// The daily bill's cost: a WeChat Pay statement of Rows rows (nine in ten
// payments, one in ten refunds), served by the loopback fake, fetched,
// parsed and compared by an edged process over a ledger that holds all
// but a hundred of its payments and a hundred of its refunds (those are
// repaired, each through the callbacks' decision). What is measured is
// POST /bills/wx/{date} from ask to answer, and edged's peak resident set
// (VmHWM) before and after: the statement streams into Postgres, so the
// peak must not grow with the statement.

// BillsConfig configures RunBills.
type BillsConfig struct {
	// Edged is the built edged binary.
	Edged string
	// Rows are the statements' sizes, one run each (default 100,000 and
	// 1,000,000).
	Rows []int
	// Progress, when set, receives a line per step.
	Progress io.Writer
}

// BillsRow is one statement's figures.
type BillsRow struct {
	Rows int `json:"rows"`
	// FileMiB is the decompressed statement's size.
	FileMiB float64 `json:"file_mib"`
	// SeedSeconds is seeding the ledger, Seconds the run (fetch, parse,
	// compare, repairs, record).
	SeedSeconds float64 `json:"seed_seconds"`
	Seconds     float64 `json:"seconds"`
	RowsPerSec  float64 `json:"rows_per_sec"`
	// PeakBeforeMiB is edged's VmHWM before the run, PeakAfterMiB after.
	PeakBeforeMiB float64 `json:"peak_before_mib"`
	PeakAfterMiB  float64 `json:"peak_after_mib"`
	// EdgedCPUus and PostgresCPUus are the processes' CPU per statement
	// row during the run, in microseconds (/proc: utime+stime, Postgres
	// with its backends).
	EdgedCPUus    float64 `json:"edged_cpu_us_per_row"`
	PostgresCPUus float64 `json:"postgres_cpu_us_per_row"`
	// Categories are the run's counts.
	Categories map[string]int `json:"categories"`
	// LoadAvg is /proc/loadavg after the run: what else ran.
	LoadAvg string `json:"loadavg"`
}

// BillsReport is RunBills' result.
type BillsReport struct {
	Rows []BillsRow `json:"rows"`
}

// billsMissing is how many payments, and how many refunds, the ledger
// lacks: the repairs each run makes.
const billsMissing = 100

// RunBills measures each statement size on a fresh database.
func RunBills(ctx context.Context, cfg BillsConfig) (BillsReport, error) {
	if len(cfg.Rows) == 0 {
		cfg.Rows = []int{100_000, 1_000_000}
	}
	progress := cfg.Progress
	if progress == nil {
		progress = io.Discard
	}
	var rep BillsReport
	cluster, err := pgtemp.Start(ctx, pgtemp.Options{})
	if err != nil {
		return rep, err
	}
	defer cluster.Stop()
	for i, n := range cfg.Rows {
		row, err := runBills(ctx, cluster, cfg.Edged, n, i, progress)
		if err != nil {
			return rep, fmt.Errorf("%d rows: %w", n, err)
		}
		rep.Rows = append(rep.Rows, row)
	}
	return rep, nil
}

func runBills(ctx context.Context, cluster *pgtemp.Cluster, edgedBin string, n, idx int, progress io.Writer) (BillsRow, error) {
	row := BillsRow{Rows: n}
	admin, err := pgxpool.New(ctx, cluster.URL("postgres"))
	if err != nil {
		return row, err
	}
	dbName := fmt.Sprintf("bills_%d", idx)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+dbName)
	admin.Close()
	if err != nil {
		return row, err
	}
	dbURL := cluster.URL(dbName)
	if err := durable.Migrate(ctx, dbURL); err != nil {
		return row, err
	}
	const date = "2026-12-05"
	fmt.Fprintf(progress, "bills %d: writing the statement\n", n)
	var file strings.Builder
	w := billtest.NewWeChatWriter(&file, true)
	payments := n - n/10
	for i := range n {
		if i < payments {
			w.Add(bill.Row{Kind: bill.Payment, Trade: fmt.Sprintf("42%018d", i), OrderNo: fmt.Sprintf("B-%d", i), Amount: 1999, Fee: 12000})
		} else {
			j := i - payments // a refund of payment j
			w.Add(bill.Row{Kind: bill.Refund, Trade: fmt.Sprintf("42%018d", j), OrderNo: fmt.Sprintf("B-%d", j),
				RefundID: fmt.Sprintf("50%018d", j), Amount: 500, Fee: -3000})
		}
	}
	w.Close()
	row.FileMiB = float64(file.Len()) / (1 << 20)

	fmt.Fprintf(progress, "bills %d: seeding the ledger\n", n)
	seedStart := time.Now()
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return row, err
	}
	defer db.Close()
	// Every payment but the last billsMissing is paid here (recorded on
	// the day); every refund but the last billsMissing is recorded; the
	// unpaid ones are registered, PENDING_PAY.
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO biz_order (order_no, status, amount, currency, paid_by, paid_at, refunded_amount)
		 SELECT 'B-' || g, CASE WHEN g < $1::int THEN 'PAID' ELSE 'PENDING_PAY' END, 1999, 'CNY',
		        CASE WHEN g < $1::int THEN 'wx:42' || lpad(g::text, 18, '0') END,
		        CASE WHEN g < $1::int THEN '2026-12-05 12:00:00+08'::timestamptz END,
		        CASE WHEN g < $2::int THEN 500 ELSE 0 END
		   FROM generate_series(0, $3::int - 1) g`, []any{payments - billsMissing, n - payments - billsMissing, payments}},
		{`INSERT INTO trade_refund (trade, refund_id, order_no, amount, created_at)
		 SELECT 'wx:42' || lpad(g::text, 18, '0'), '50' || lpad(g::text, 18, '0'), 'B-' || g, 500, '2026-12-05 13:00:00+08'
		   FROM generate_series(0, $1::int - 1) g`, []any{n - payments - billsMissing}},
		{`VACUUM ANALYZE biz_order`, nil}, {`VACUUM ANALYZE trade_refund`, nil},
	} {
		if _, err := db.Exec(ctx, q.sql, q.args...); err != nil {
			return row, fmt.Errorf("seed: %w", err)
		}
	}
	row.SeedSeconds = time.Since(seedStart).Seconds()

	platform, err := channeltest.NewWeChatPaySigner()
	if err != nil {
		return row, err
	}
	merchant, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return row, err
	}
	const mchID, serial = "1900000109", "5157F09EFDC096DE15EBE81A47057A7232F1B8E1"
	fake := querytest.NewWeChatFake(querytest.WeChatFakeConfig{MchID: mchID, MerchantKey: &merchant.PublicKey, MerchantSerial: serial, Platform: platform})
	defer fake.Close()
	fake.SetBill(date, querytest.Bill{File: []byte(file.String())})
	file = strings.Builder{}

	pkcs8, err := x509.MarshalPKCS8PrivateKey(merchant)
	if err != nil {
		return row, err
	}
	pub, adm := freeAddr(), freeAddr()
	const token = "bench-admin"
	proc, err := startEdged(edgedBin, []string{"-listen", pub, "-admin-listen", adm, "-bills=false", "-reconcile=false"}, []string{
		"DATABASE_URL=" + dbURL, "EDGE_ADMIN_TOKEN=" + token,
		"EDGE_SECRET_WX=" + platform.APIv3Key, "EDGE_CHANNEL_WX_KIND=wechatpay",
		"EDGE_CHANNEL_WX_PLATFORM_KEYS=" + platform.Serial + "=" + platform.PublicKeyBase64(), "EDGE_CHANNEL_WX_MCHID=" + mchID,
		"EDGE_CHANNEL_WX_MERCHANT_KEY=" + string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8})),
		"EDGE_CHANNEL_WX_MERCHANT_SERIAL=" + serial, "EDGE_CHANNEL_WX_API_URL=" + fake.URL()})
	if err != nil {
		return row, err
	}
	defer proc.stop()
	if err := waitStatus(ctx, "http://"+adm+"/readyz", 60*time.Second); err != nil {
		return row, fmt.Errorf("edged: %w", err)
	}
	row.PeakBeforeMiB = peakRSSMiB(proc.pid)

	pgPID := postmasterPID(ctx, db)
	ticks := func() (edged, pg uint64) {
		procs, err := readAllProcStats()
		if err != nil {
			return 0, 0
		}
		edged, _ = treeTicks(procs, proc.pid)
		pg, _ = treeTicks(procs, pgPID)
		return edged, pg
	}
	e0, p0 := ticks()
	fmt.Fprintf(progress, "bills %d: POST /bills/wx/%s\n", n, date)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+adm+"/bills/wx/"+date, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	start := time.Now()
	resp, err := (&http.Client{Timeout: 30 * time.Minute}).Do(req)
	if err != nil {
		return row, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	row.Seconds = time.Since(start).Seconds()
	row.RowsPerSec = float64(n) / row.Seconds
	row.PeakAfterMiB = peakRSSMiB(proc.pid)
	e1, p1 := ticks()
	us := 1e6 / float64(procstat.ClockTicks()) / float64(n)
	row.EdgedCPUus, row.PostgresCPUus = float64(e1-e0)*us, float64(p1-p0)*us
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		row.LoadAvg = strings.TrimSpace(string(la))
	}
	var run durable.BillRun
	if resp.StatusCode != 200 || json.Unmarshal(body, &run) != nil || run.State != durable.BillOK {
		return row, fmt.Errorf("POST /bills: %d %s", resp.StatusCode, clipText(string(body)))
	}
	row.Categories = run.Categories
	want := map[string]int{durable.BillMatched: n - 2*billsMissing, durable.BillChannelOnly: 2 * billsMissing}
	for c, v := range want {
		if run.Categories[c] != v {
			return row, fmt.Errorf("%s: %d, want %d (%v)", c, run.Categories[c], v, run.Categories)
		}
	}
	fmt.Fprintf(progress, "bills %d: %.1f s, edged peak %.0f -> %.0f MiB\n", n, row.Seconds, row.PeakBeforeMiB, row.PeakAfterMiB)
	return row, nil
}

// billsEdged is an edged process of the bills' runs.
type billsEdged struct {
	pid  int
	cmd  *osexec.Cmd
	done chan struct{}
}

// startEdged starts bin with args and env added to the bench's, its output
// discarded; it dies with the bench (Pdeathsig, which follows the forking
// thread: the goroutine that starts it keeps its thread until it exits).
func startEdged(bin string, args, env []string) (*billsEdged, error) {
	p := &billsEdged{done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer close(p.done)
		cmd := osexec.Command(bin, args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("start edged: %w", err)
			return
		}
		p.cmd, p.pid = cmd, cmd.Process.Pid
		started <- nil
		cmd.Wait()
	}()
	return p, <-started
}

// stop stops edged (SIGTERM) and waits for it.
func (p *billsEdged) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	<-p.done
}

func clipText(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

// Table renders the report.
func (r BillsReport) Table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%10s %9s %9s %9s %12s %16s %14s %14s %9s %13s  %s\n", "rows", "file MiB", "seed s", "run s", "rows/s", "edged peak MiB",
		"edged µs/row", "postgres µs/row", "matched", "channel_only", "loadavg")
	for _, x := range r.Rows {
		fmt.Fprintf(&b, "%10d %9.1f %9.1f %9.2f %12.0f %7.0f -> %5.0f %14.2f %14.2f %9d %13d  %s\n", x.Rows, x.FileMiB, x.SeedSeconds, x.Seconds, x.RowsPerSec,
			x.PeakBeforeMiB, x.PeakAfterMiB, x.EdgedCPUus, x.PostgresCPUus, x.Categories[durable.BillMatched], x.Categories[durable.BillChannelOnly], x.LoadAvg)
	}
	return b.String()
}
