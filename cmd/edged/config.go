package main

import (
	"crypto/rsa"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/edge/channel"
	"github.com/notifyedge/notifyedge/edge/reconcile"
	"github.com/notifyedge/notifyedge/edge/tracing"
)

// Config is edged's configuration: flags, falling back to environment
// variables, falling back to the documented defaults.
type Config struct {
	Listen      string
	AdminListen string
	DatabaseURL string
	RedisURL    string
	StreamURL   string
	StreamName  string
	// StreamReplicas is how many replicas of the stream's master must hold
	// a published batch before its outbox rows are marked published.
	StreamReplicas int
	AdminToken     string
	OrdersToken    string
	Budget         time.Duration
	MaxBody        int
	ResultTTL      time.Duration
	Drain          time.Duration
	// StartTimeout is how long edged waits for Postgres at start (0: for
	// ever) before it exits.
	StartTimeout time.Duration
	// DrainDelay is how long, from SIGTERM, /readyz answers 503 while the
	// public listener still serves, so load balancers stop routing first.
	DrainDelay time.Duration
	// IdleTimeout closes keep-alive connections that send nothing;
	// MaxConnsPerIP caps one client address's connections (0: no cap).
	IdleTimeout   time.Duration
	MaxConnsPerIP int
	Relay         bool
	// GroupCommit decides concurrent first deliveries together
	// (durable.Config.GroupCommit).
	GroupCommit bool
	Dev         bool
	Channels    []ChannelConfig
	// Tracing is on when the environment names an OTLP endpoint
	// (tracing.Enabled): the SDK then reads its own variables.
	Tracing bool

	// ClaimRetention, OutboxRetention and ReviewRetention are retention's
	// ages (durable.RetentionConfig): claims; published outbox and
	// consumer-inbox rows; resolved review rows.
	ClaimRetention  time.Duration
	OutboxRetention time.Duration
	ReviewRetention time.Duration

	// Reconcile asks the channels about orders still PENDING_PAY:
	// ReconcileAfter past their registration, then on a back-off until
	// ReconcileHorizon, at most ReconcileRate queries a second per channel.
	Reconcile        bool
	ReconcileAfter   time.Duration
	ReconcileHorizon time.Duration
	ReconcileRate    float64

	// Bills compares each channel's daily statement with the ledger:
	// BillsAt past midnight in BillsZone (the previous day's), again every
	// half hour until BillsGiveUp; runs are kept BillRetention.
	Bills         bool
	BillsAt       time.Duration
	BillsGiveUp   time.Duration
	BillsZone     *time.Location
	BillRetention time.Duration
}

// ChannelConfig is one channel from EDGE_SECRET_<NAME> (or
// EDGE_SECRETFILE_<NAME>) and EDGE_CHANNEL_<NAME>_*.
type ChannelConfig struct {
	Name string
	Kind string
	// Secrets are the secret's white-space separated parts; Secret is it
	// whole (PEM keys span lines), and SecretVar the variable it came from.
	Secrets   []string
	Secret    string
	SecretVar string
	// Vars are the adapter's own EDGE_CHANNEL_<NAME>_* variables, by the
	// part after the prefix (e.g. "MCHID").
	Vars map[string]string
}

// varName names the channel's variable k: EDGE_CHANNEL_<NAME>_<k>.
func (cc ChannelConfig) varName(k string) string {
	return "EDGE_CHANNEL_" + strings.ToUpper(cc.Name) + "_" + k
}

// ParseConfig reads args (without the program name) and env ("K=V" pairs).
// Every setting is a flag with its environment variable: the variable is
// the default, the flag wins; each is parsed once, by its own type.
func ParseConfig(args, env []string) (Config, error) {
	vars := envVars(env)
	var c Config
	fs := flag.NewFlagSet("edged", flag.ContinueOnError)
	settings := []struct {
		name, env, def, usage string
		value                 flag.Value
	}{
		{"listen", "EDGE_LISTEN", ":8080", "public listen address", (*stringValue)(&c.Listen)},
		{"admin-listen", "EDGE_ADMIN_LISTEN", "127.0.0.1:9090", "admin listen address", (*stringValue)(&c.AdminListen)},
		{"budget", "EDGE_BUDGET", "200ms", "latency budget from request read to response written", positive(&c.Budget)},
		{"max-body", "EDGE_MAX_BODY", "64KiB", "largest accepted body", (*sizeValue)(&c.MaxBody)},
		{"result-ttl", "EDGE_RESULT_TTL", "24h", "how long the cache keeps a result", positive(&c.ResultTTL)},
		{"drain", "EDGE_DRAIN", "10s", "how long in-flight requests may finish on shutdown", positive(&c.Drain)},
		{"start-timeout", "EDGE_START_TIMEOUT", "60s", "how long to wait for Postgres at start, 0 for ever", nonNegative(&c.StartTimeout)},
		{"drain-delay", "EDGE_DRAIN_DELAY", "5s", "from SIGTERM, how long /readyz answers 503 while the listener still serves", nonNegative(&c.DrainDelay)},
		{"relay", "EDGE_RELAY", "true", "run the outbox relay where EDGE_STREAM_URL is set", (*boolValue)(&c.Relay)},
		{"stream-replicas", "EDGE_STREAM_REPLICAS", "0", "replicas that must hold a published entry (WAIT) before its outbox row is marked published", (*countValue)(&c.StreamReplicas)},
		{"group-commit", "EDGE_GROUP_COMMIT", "true", "decide concurrent first deliveries together, one transaction per batch", (*boolValue)(&c.GroupCommit)},
		{"claim-retention", "EDGE_CLAIM_RETENTION", "168h", "delete claims older than this, at least 25h: the channels' retry window", positive(&c.ClaimRetention)},
		{"outbox-retention", "EDGE_OUTBOX_RETENTION", "168h", "delete published outbox rows and consumer-inbox rows older than this", positive(&c.OutboxRetention)},
		{"review-retention", "EDGE_REVIEW_RETENTION", "2160h", "delete resolved review rows, which hold raw bodies, older than this", positive(&c.ReviewRetention)},
		{"idle-timeout", "EDGE_IDLE_TIMEOUT", "5s", "close keep-alive connections idle this long", positive(&c.IdleTimeout)},
		{"max-conns-per-ip", "EDGE_MAX_CONNS_PER_IP", "256", "connections one client address may hold open, 0 for no cap: set 0 behind a proxy", (*countValue)(&c.MaxConnsPerIP)},
		{"reconcile", "EDGE_RECONCILE", "true", "ask the channels about orders still PENDING_PAY, where query credentials are set", (*boolValue)(&c.Reconcile)},
		{"reconcile-after", "EDGE_RECONCILE_AFTER", "10m", "first ask about a PENDING_PAY order this long after it was registered", positive(&c.ReconcileAfter)},
		{"reconcile-horizon", "EDGE_RECONCILE_HORIZON", "72h", "stop asking about an order this long after it was registered", positive(&c.ReconcileHorizon)},
		{"reconcile-rate", "EDGE_RECONCILE_RATE", "10", "queries a second per channel, at most (above 0, up to 1000)", (*rateValue)(&c.ReconcileRate)},
		{"bills", "EDGE_BILLS", "true", "compare each channel's daily statement with the ledger, where query credentials are set", (*boolValue)(&c.Bills)},
		{"bills-at", "EDGE_BILLS_AT", "10:30", "fetch the previous day's statements after this time of day, HH:MM in -bills-tz", (*timeOfDayValue)(&c.BillsAt)},
		{"bills-tz", "EDGE_BILLS_TZ", "Asia/Shanghai", "the zone of the channels' days", zoneValue{&c.BillsZone}},
		{"bills-give-up", "EDGE_BILLS_GIVE_UP", "18:00", "a statement still not ready at this time of day is missing, HH:MM", (*timeOfDayValue)(&c.BillsGiveUp)},
		{"bill-retention", "EDGE_BILL_RETENTION", "2160h", "delete bill runs and their items older than this", positive(&c.BillRetention)},
	}
	for _, st := range settings {
		if err := st.value.Set(st.def); err != nil {
			panic("BUG: the default of -" + st.name + ": " + err.Error())
		}
		fs.Var(st.value, st.name, st.usage+" ("+st.env+")")
	}
	fs.BoolVar(&c.Dev, "dev", false, "throwaway Postgres and in-process Redis unless DATABASE_URL/REDIS_URL are given")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	// The environment fills what no flag set: a flag wins, even over a
	// variable that would not parse.
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, st := range settings {
		if e := vars[st.env]; e != "" && !given[st.name] {
			if err := st.value.Set(e); err != nil {
				return Config{}, fmt.Errorf("-%s (%s): %w", st.name, st.env, err)
			}
		}
	}
	if c.ClaimRetention < durable.MinClaimRetention {
		return Config{}, fmt.Errorf("-claim-retention (EDGE_CLAIM_RETENTION): %s is below %s, the channels' retry window: a retry must still find its claim",
			c.ClaimRetention, durable.MinClaimRetention)
	}
	if c.ReconcileHorizon <= c.ReconcileAfter {
		return Config{}, fmt.Errorf("-reconcile-horizon (%s) must be past -reconcile-after (%s)", c.ReconcileHorizon, c.ReconcileAfter)
	}
	if c.BillsGiveUp <= c.BillsAt {
		return Config{}, fmt.Errorf("-bills-give-up (%s) must be later in the day than -bills-at (%s)", clockOf(c.BillsGiveUp), clockOf(c.BillsAt))
	}
	var err error
	c.Tracing = tracing.Enabled(func(k string) string { return vars[k] })
	c.DatabaseURL = vars["DATABASE_URL"]
	c.RedisURL = vars["REDIS_URL"]
	c.StreamURL = vars["EDGE_STREAM_URL"]
	c.StreamName = vars["EDGE_STREAM_NAME"]
	c.AdminToken = vars["EDGE_ADMIN_TOKEN"]
	c.OrdersToken = vars["EDGE_ORDERS_TOKEN"]
	if c.Channels, err = parseChannels(vars); err != nil {
		return Config{}, err
	}
	if !c.Dev && c.DatabaseURL == "" {
		return Config{}, errors.New("DATABASE_URL is required (a production node never falls back to a throwaway database; use -dev for one)")
	}
	if !c.Dev && len(c.Channels) == 0 {
		return Config{}, errors.New("no channel configured: set EDGE_SECRET_<CHANNEL> (e.g. EDGE_SECRET_ACME=whsec_...)")
	}
	return c, nil
}

// The settings' types: each parses and checks its text once, whether it
// comes from the environment or a flag.
type (
	stringValue    string
	boolValue      bool
	countValue     int // a whole number >= 0
	sizeValue      int // bytes: "65536", "64KiB", "1MiB", "64KB", "1MB"
	rateValue      float64
	timeOfDayValue time.Duration // HH:MM past midnight, 00:00 to 24:00
	zoneValue      struct{ z **time.Location }
	durationValue  struct {
		d         *time.Duration
		allowZero bool
	}
)

func (v *stringValue) Set(s string) error { *v = stringValue(s); return nil }
func (v *stringValue) String() string     { return string(*v) }

func (v *boolValue) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("%q is not true or false", s)
	}
	*v = boolValue(b)
	return nil
}

// String prints the value. A boolValue is not a flag.boolFlag: "-relay
// false" takes its value as every other setting does, as it always has.
func (v *boolValue) String() string { return strconv.FormatBool(bool(*v)) }

func (v *countValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("%q is not a whole number ≥ 0", s)
	}
	*v = countValue(n)
	return nil
}
func (v *countValue) String() string { return strconv.Itoa(int(*v)) }

func (v *sizeValue) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*v = sizeValue(n)
	return nil
}
func (v *sizeValue) String() string {
	switch n := int(*v); {
	case n > 0 && n%(1<<20) == 0:
		return strconv.Itoa(n>>20) + "MiB"
	case n > 0 && n%(1<<10) == 0:
		return strconv.Itoa(n>>10) + "KiB"
	default:
		return strconv.Itoa(n)
	}
}

func (v *rateValue) Set(s string) error {
	r, err := strconv.ParseFloat(s, 64)
	if err != nil || !(r > 0) || r > 1000 {
		return fmt.Errorf("%q is not a rate of queries a second per channel (above 0, at most 1000)", s)
	}
	*v = rateValue(r)
	return nil
}
func (v *rateValue) String() string { return strconv.FormatFloat(float64(*v), 'f', -1, 64) }

func (v *timeOfDayValue) Set(s string) error {
	if s == "24:00" {
		*v = timeOfDayValue(24 * time.Hour)
		return nil
	}
	t, err := time.Parse("15:04", s)
	if err != nil || len(s) != 5 {
		return fmt.Errorf("%q is not a time of day HH:MM", s)
	}
	*v = timeOfDayValue(time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute)
	return nil
}
func (v *timeOfDayValue) String() string { return clockOf(time.Duration(*v)) }

// clockOf prints a time past midnight as HH:MM.
func clockOf(d time.Duration) string {
	return fmt.Sprintf("%02d:%02d", int(d.Hours()), int(d.Minutes())%60)
}

func (v zoneValue) Set(s string) error {
	z, err := time.LoadLocation(s)
	if err != nil || s == "" || s == "Local" {
		return fmt.Errorf("%q is not a time zone name such as Asia/Shanghai", s)
	}
	*v.z = z
	return nil
}
func (v zoneValue) String() string {
	if v.z == nil || *v.z == nil {
		return ""
	}
	return (*v.z).String()
}

// positive is a duration above 0; nonNegative one of 0 or more.
func positive(d *time.Duration) *durationValue    { return &durationValue{d: d} }
func nonNegative(d *time.Duration) *durationValue { return &durationValue{d: d, allowZero: true} }

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(s)
	switch {
	case (err != nil || d < 0) && v.allowZero:
		return fmt.Errorf("%q is not a duration ≥ 0", s)
	case err != nil || d <= 0 && !v.allowZero:
		return fmt.Errorf("%q is not a positive duration", s)
	}
	*v.d = d
	return nil
}
func (v *durationValue) String() string {
	if v.d == nil {
		return ""
	}
	return v.d.String()
}

// parseSize reads "65536", "64KiB", "1MiB", "64KB" or "1MB".
func parseSize(s string) (int, error) {
	units := []struct {
		suffix string
		mult   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"KB", 1000}, {"MB", 1000 * 1000}, {"B", 1}, {"", 1}}
	for _, u := range units {
		num, ok := strings.CutSuffix(s, u.suffix)
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(num))
		if err != nil || n <= 0 || n > (1<<30)/u.mult {
			return 0, fmt.Errorf("%q is not a size such as 64KiB", s)
		}
		return n * u.mult, nil
	}
	return 0, fmt.Errorf("%q is not a size such as 64KiB", s)
}

// envVars maps "K=V" pairs.
func envVars(env []string) map[string]string {
	vars := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	return vars
}

// parseChannels finds EDGE_SECRET_<NAME> and EDGE_SECRETFILE_<NAME>.
func parseChannels(vars map[string]string) ([]ChannelConfig, error) {
	secrets, from := map[string]string{}, map[string]string{}
	for k, v := range vars {
		if name, ok := strings.CutPrefix(k, "EDGE_SECRETFILE_"); ok {
			b, err := os.ReadFile(v)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			if _, dup := vars["EDGE_SECRET_"+name]; dup {
				return nil, fmt.Errorf("channel %s: set EDGE_SECRET_%s or EDGE_SECRETFILE_%s, not both", strings.ToLower(name), name, name)
			}
			secrets[name], from[name] = string(b), k
		} else if name, ok := strings.CutPrefix(k, "EDGE_SECRET_"); ok {
			secrets[name], from[name] = v, k
		}
	}
	var out []ChannelConfig
	for upper, list := range secrets {
		name := strings.ToLower(upper)
		if !channel.ValidChannelName(name) || strings.ToUpper(name) != upper {
			return nil, fmt.Errorf("EDGE_SECRET_%s: channel names are [a-z0-9_]{1,32}", upper)
		}
		cc := ChannelConfig{Name: name, Kind: vars["EDGE_CHANNEL_"+upper+"_KIND"], Secrets: strings.Fields(list),
			Secret: list, SecretVar: from[upper]}
		prefix := "EDGE_CHANNEL_" + upper + "_"
		for k, v := range vars {
			if rest, ok := strings.CutPrefix(k, prefix); ok && rest != "KIND" {
				if cc.Vars == nil {
					cc.Vars = map[string]string{}
				}
				cc.Vars[rest] = v
			}
		}
		if cc.Kind == "" {
			cc.Kind = "generic"
		}
		if len(cc.Secrets) == 0 {
			return nil, fmt.Errorf("channel %s: no secret", name)
		}
		out = append(out, cc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// builtChannel is one configured channel: its adapter, the keys of it that
// came as certificates (their expiry is watched), and its query client for
// reconciliation (nil without outbound credentials).
type builtChannel struct {
	ch      channel.Channel
	certs   []channel.PublicKey
	querier reconcile.Querier
}

// channelKeys are the keys a channel verifies with, which verify its
// answers to queries too.
type channelKeys struct {
	wechat         map[string]*rsa.PublicKey
	wechatNotAfter map[string]time.Time
	alipay         []*rsa.PublicKey
	alipayNotAfter []time.Time
}

// newChannel builds a configured channel.
func newChannel(cc ChannelConfig) (builtChannel, error) {
	env := cc.varName
	var b builtChannel
	var keys channelKeys
	var err error
	switch cc.Kind {
	case "generic":
		if len(cc.Vars) > 0 {
			return b, fmt.Errorf("channel %s: a generic channel takes no EDGE_CHANNEL_%s_* variables", cc.Name, strings.ToUpper(cc.Name))
		}
		b.ch, err = channel.NewGeneric(channel.GenericConfig{Name: cc.Name, Secrets: cc.Secrets})
		return b, err
	case "wechatpay":
		if len(cc.Secrets) != 1 {
			return b, fmt.Errorf("channel %s: %s is the one APIv3 key", cc.Name, cc.SecretVar)
		}
		pks, err := platformKeys(cc, env)
		if err != nil {
			return b, err
		}
		keys.wechat, keys.wechatNotAfter = map[string]*rsa.PublicKey{}, map[string]time.Time{}
		for _, k := range pks {
			keys.wechat[k.Serial] = k.Key
			if !k.NotAfter.IsZero() {
				keys.wechatNotAfter[k.Serial] = k.NotAfter
				b.certs = append(b.certs, k)
			}
		}
		if b.ch, err = channel.NewWeChatPay(channel.WeChatPayConfig{Name: cc.Name, APIv3Key: cc.Secrets[0], PlatformKeys: keys.wechat,
			NotAfter: keys.wechatNotAfter, MchID: cc.Vars["MCHID"], AppIDs: strings.Fields(cc.Vars["APPID"])}); err != nil {
			return b, err
		}
	case "alipay":
		pks, err := channel.ParsePublicKeyFile([]byte(cc.Secret))
		if err != nil {
			return b, fmt.Errorf("channel %s: %s: %w", cc.Name, cc.SecretVar, err)
		}
		for _, k := range pks {
			keys.alipay, keys.alipayNotAfter = append(keys.alipay, k.Key), append(keys.alipayNotAfter, k.NotAfter)
			if !k.NotAfter.IsZero() {
				b.certs = append(b.certs, k)
			}
		}
		if b.ch, err = channel.NewAlipay(channel.AlipayConfig{Name: cc.Name, PublicKeys: keys.alipay, NotAfter: keys.alipayNotAfter,
			AppIDs: strings.Fields(cc.Vars["APP_ID"]), SellerID: cc.Vars["SELLER_ID"]}); err != nil {
			return b, err
		}
	default:
		return b, fmt.Errorf("channel %s: unknown kind %q (%s): generic, wechatpay or alipay",
			cc.Name, cc.Kind, env("KIND"))
	}
	b.querier, err = newQuerier(cc, keys)
	return b, err
}

// platformKeys reads WeChat Pay's platform keys: EDGE_CHANNEL_<C>_PLATFORM_KEYS
// (SERIAL=<key> entries and bare certificates, whose serial is their own)
// and EDGE_CHANNEL_<C>_PLATFORM_KEYS_FILE (a file, or a directory of .pem,
// .crt, .cer and .der files, extensions in any case; a key without a serial
// takes its file's name).
func platformKeys(cc ChannelConfig, env func(string) string) ([]channel.PublicKey, error) {
	var keys []channel.PublicKey
	if v := cc.Vars["PLATFORM_KEYS"]; strings.TrimSpace(v) != "" {
		ks, err := channel.ParsePublicKeys(v)
		if err != nil {
			return nil, fmt.Errorf("channel %s: %s: %w", cc.Name, env("PLATFORM_KEYS"), err)
		}
		for i, k := range ks {
			if k.Serial == "" {
				return nil, fmt.Errorf("channel %s: %s: entry %d: a public key needs SERIAL= before it", cc.Name, env("PLATFORM_KEYS"), i+1)
			}
		}
		keys = append(keys, ks...)
	}
	if path := cc.Vars["PLATFORM_KEYS_FILE"]; path != "" {
		files := []string{path}
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			if files, err = keyFiles(path); err != nil {
				return nil, fmt.Errorf("channel %s: %s: %w", cc.Name, env("PLATFORM_KEYS_FILE"), err)
			}
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				return nil, fmt.Errorf("channel %s: %s: %w", cc.Name, env("PLATFORM_KEYS_FILE"), err)
			}
			ks, err := channel.ParsePublicKeyFile(b)
			if err != nil {
				return nil, fmt.Errorf("channel %s: %s: %s: %w", cc.Name, env("PLATFORM_KEYS_FILE"), filepath.Base(f), err)
			}
			for i := range ks {
				if ks[i].Serial == "" {
					ks[i].Serial = strings.TrimSuffix(filepath.Base(f), filepath.Ext(f))
				}
			}
			keys = append(keys, ks...)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("channel %s: no platform key: set %s or %s", cc.Name, env("PLATFORM_KEYS"), env("PLATFORM_KEYS_FILE"))
	}
	return keys, nil
}

// keyExtensions are the file names a directory of platform keys holds,
// compared in lower case (a download may be named APICLIENT.PEM).
var keyExtensions = map[string]bool{".pem": true, ".crt": true, ".cer": true, ".der": true}

// keyFiles lists the key and certificate files of dir by their
// extensions in any case, sorted; other files (notes, a mounted secret's
// "..data" bookkeeping) and subdirectories are passed over.
func keyFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !keyExtensions[strings.ToLower(filepath.Ext(name))] {
			continue
		}
		full := filepath.Join(dir, name)
		st, err := os.Stat(full) // follows links, as a mounted secret's files are
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, full)
		}
	}
	sort.Strings(files)
	return files, nil
}
