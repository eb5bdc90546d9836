package durable

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The SQL functions and Go share one vocabulary: outcomes, review reasons,
// topics, states, events, the machine's actions and parties. Go defines it
// (result.go, state.go); the functions spell some of it as literals.
// checkVocabulary reads every literal of the functions as a database has
// them installed (TestInstalledFunctionsShareGosVocabulary hands it
// pg_get_functiondef of each) and checks each word is one Go knows, and
// that every word Go knows is one the SQL (or the machine Go hands it) can
// produce: a typo on either side, or a name added on one side only, fails
// here rather than as an answer no adapter can render.

var (
	sqlComment = regexp.MustCompile(`--[^\n]*`)
	sqlLiteral = regexp.MustCompile(`'((?:[^']|'')*)'`)
	upperWord  = regexp.MustCompile(`^[A-Z][A-Z_]*$`)
	lowerWord  = regexp.MustCompile(`^[a-z][a-z_]*$`)
	// sqlBody is a function's body in pg_get_functiondef's output (its
	// header holds no vocabulary, only settings such as 'off').
	sqlBody = regexp.MustCompile(`(?s)\bAS (\$[a-z_]*\$)(.*)(\$[a-z_]*\$)\s*$`)
)

// sqlLiterals returns the string literals of each function's body,
// comments stripped (they hold apostrophes).
func sqlLiterals(t testing.TB, defs map[string]string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	n := 0
	for name, def := range defs {
		m := sqlBody.FindStringSubmatch(def)
		if m == nil || m[1] != m[3] {
			t.Fatalf("%s: no body in its definition:\n%s", name, def)
		}
		for _, l := range sqlLiteral.FindAllStringSubmatch(sqlComment.ReplaceAllString(m[2], ""), -1) {
			out[name] = append(out[name], strings.ReplaceAll(l[1], "''", "'"))
			n++
		}
	}
	if n < 20 {
		t.Fatalf("found %d literals: the parse is wrong", n)
	}
	return out
}

// checkVocabulary checks the literals of the functions defs (name ->
// pg_get_functiondef) against Go's vocabulary.
func checkVocabulary(t testing.TB, defs map[string]string) {
	t.Helper()
	known := map[string]string{} // word -> what it is
	add := func(kind string, words ...string) {
		for _, w := range words {
			if w != "" {
				known[w] = kind
			}
		}
	}
	for _, o := range Outcomes {
		add("outcome", o.String())
	}
	add("outcome", replayedOutcome)
	add("batch outcome", busyOutcome)
	for _, r := range ReviewReasons {
		add("review reason", string(r))
	}
	for _, tp := range Topics {
		add("topic", string(tp))
	}
	for _, s := range States {
		add("state", string(s))
	}
	for _, e := range Events {
		add("event", string(e))
	}
	for _, a := range actions {
		add("action", string(a))
	}
	add("party", string(payingTrade), string(otherTrade))
	for _, r := range []ShipResult{ShipApplied, NotShipped, DuplicateMessage} {
		add("ship result", r.String())
	}
	// Words of the schema and of PostgreSQL, not of the decision.
	add("claim state", "DONE")
	add("resolver", "notifyedge")
	add("SQLSTATE", "serialization_failure")
	add("setting", "lock_timeout")
	add("outbox payload key", "order_no", "event_type", "from", "to", "biz_key",
		"trade", "refund_id", "refund_amount", "refunded_amount",
		"amount", "currency", "channel", "paid_by", "occurred_at", "via")
	add("via", ViaCallback, ViaQuery, ViaBill, ViaRedrive, ViaOrdersAPI)
	add("setting", "notifyedge.via")
	// occurred_at: RFC 3339 in UTC, and the channel of a trade
	// "{channel}:{channel_txn_id}".
	add("time format", "UTC", `YYYY-MM-DD"T"HH24:MI:SS.US"Z"`)
	add("trade separator", ":")

	seen := map[string]bool{}
	canonicalParts := 0
	for name, literals := range sqlLiterals(t, defs) {
		for _, l := range literals {
			seen[l] = true
			if kind := known[l]; kind == "time format" || kind == "trade separator" || kind == "setting" {
				continue
			}
			switch {
			case l == "", l == "{}": // "{}": an empty array
			case upperWord.MatchString(l) || lowerWord.MatchString(l):
				if _, ok := known[l]; !ok {
					t.Errorf("%s: SQL literal %q is no outcome, reason, topic, state, event, action or party Go knows", name, l)
				}
			case l == canonicalHead, l == canonicalMiddle, l == canonicalTail:
				// The canonical result is written by SQL and read by
				// result.go; its one writer is notifyedge_result.
				if name != "notifyedge_result" {
					t.Errorf("%s writes a canonical result itself (%q): notifyedge_result is its one writer", name, l)
				}
				canonicalParts++
			case strings.Contains(l, `"http"`), strings.Contains(l, `"status"`):
				t.Errorf("%s: SQL literal %q is not the canonical result result.go reads (%s...%s...%s)",
					name, l, canonicalHead, canonicalMiddle, canonicalTail)
			case strings.HasPrefix(l, ":"):
				// The biz_key suffix of a payment, which names its trade.
				if l != ":"+string(PaySuccess) {
					t.Errorf("%s: SQL's payment key suffix %q, want %q", name, l, ":"+string(PaySuccess))
				}
			case strings.Contains(l, " "):
				// A message or a resolution: prose, not vocabulary.
			default:
				t.Errorf("%s: SQL literal %q has no known shape", name, l)
			}
		}
	}
	if canonicalParts != 3 {
		t.Errorf("the canonical result's three parts appear %d times, want once each, in notifyedge_result", canonicalParts)
	}

	// And the other way: every word Go defines is one SQL can produce,
	// itself or from the machine Go hands it.
	fromMachine := map[string]bool{}
	for _, tbl := range machine {
		fromMachine[string(tbl.partial)] = true
		for _, c := range tbl.cells {
			fromMachine[string(c.to)] = true
			fromMachine[string(c.topic)] = true
			fromMachine[string(c.review)] = true
		}
	}
	for _, o := range Outcomes {
		if !seen[o.String()] {
			t.Errorf("outcome %q is never returned by notifyedge_process", o)
		}
	}
	if !seen[replayedOutcome] {
		t.Errorf("outcome %q is never returned by notifyedge_process", replayedOutcome)
	}
	if !seen[busyOutcome] {
		t.Errorf("batch outcome %q is never returned by notifyedge_process_batch", busyOutcome)
	}
	for _, r := range ReviewReasons {
		if r == ReviewMerchantMismatch || r == ReviewRefundedAtChannel || r == ReviewNotInBill || r == ReviewBillMismatch {
			continue // the edge, reconciliation and the bills record them (RecordReview, BillReview), not Process
		}
		if !seen[string(r)] && !fromMachine[string(r)] {
			t.Errorf("review reason %q is opened by neither the SQL nor the machine", r)
		}
	}
	for _, tp := range Topics {
		if !fromMachine[string(tp)] {
			t.Errorf("topic %q is written by no cell of the machine", tp)
		}
	}
	for _, a := range actions {
		if !seen[string(a)] {
			t.Errorf("action %q is not handled by the SQL", a)
		}
	}
	for _, p := range []party{payingTrade, otherTrade} {
		if !seen[string(p)] {
			t.Errorf("party %q is not handled by the SQL", p)
		}
	}
}

// The machine covers every state of every event once, or twice where the
// trade decides: the paying trade's cell, then the other trade's, as the
// SQL looks them up.
func TestMachineCoversEveryState(t *testing.T) {
	for _, e := range Events {
		tbl, ok := machine[e]
		if !ok {
			t.Errorf("%s: no row in the machine", e)
			continue
		}
		var got []State
		for i := 0; i < len(tbl.cells); i++ {
			c := tbl.cells[i]
			got = append(got, c.from)
			switch c.party {
			case anyTrade:
			case payingTrade:
				if i+1 == len(tbl.cells) || tbl.cells[i+1].from != c.from || tbl.cells[i+1].party != otherTrade {
					t.Errorf("%s on %s: the paying trade's cell is not followed by the other trade's", e, c.from)
				}
				i++
			default:
				t.Errorf("%s on %s: a %q cell without a paying one before it", e, c.from, c.party)
			}
		}
		if !slices.Equal(got, States) {
			t.Errorf("%s covers %v, want %v in that order", e, got, States)
		}
		for _, c := range tbl.cells {
			moves := c.act == actMove || c.act == actPay || c.act == actSettle || c.act == actRefund
			if moves != (c.to != "" && c.topic != "") {
				t.Errorf("%s on %s (%s): a move needs a target and a topic, and only a move has them", e, c.from, c.act)
			}
			if c.review != "" && c.act != actSkip {
				t.Errorf("%s on %s: only a skip opens the cell's review", e, c.from)
			}
		}
		if (tbl.partial != "") != slices.ContainsFunc(tbl.cells, func(c cell) bool { return c.act == actRefund }) {
			t.Errorf("%s: a partial topic belongs to refund cells", e)
		}
	}
}

// The channel events are exactly the ones ParseChannelEvent accepts, and
// each reaches Process through a statement of its own.
func TestEveryChannelEventHasProcessRules(t *testing.T) {
	for _, e := range Events {
		_, channel := ParseChannelEvent([]byte(e))
		_, hasSQL := processSQL[e]
		if channel != hasSQL {
			t.Errorf("%s: channel event %v, a Process statement %v", e, channel, hasSQL)
		}
	}
	for _, e := range []Event{Ship, Close} {
		if _, ok := ParseChannelEvent([]byte(e)); ok {
			t.Errorf("%s is internal, yet a channel may send it", e)
		}
	}
	if sqlProcess != processSQL[PaySuccess] || !strings.Contains(sqlProcess, "'ORDER_PAID'") {
		t.Error("sqlProcess, which every connection prepares, is not the payment's statement")
	}
}
