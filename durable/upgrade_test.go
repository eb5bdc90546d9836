package durable_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/notifyedge/notifyedge/durable"
	"github.com/notifyedge/notifyedge/durable/durabletest"
)

// Point 4: a database an older build (schema version 3) filled, migrated
// to the current schema. Orders paid before learn their payer from their
// applied PAY_SUCCESS claim; one whose claim is gone (or that an order
// system paid itself) keeps paid_by NULL and adopts the first trade a
// refund or close names; a REFUNDED order is refunded in full.
func TestUpgradeFillsPaidBy(t *testing.T) {
	ctx := context.Background()
	url := durabletestCreateEmpty(t)
	if err := durable.MigrateTo(ctx, url, 3); err != nil {
		t.Fatal(err)
	}
	db := durabletest.Pool(t, url)
	b := &bundle{url: url, db: db}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	const applied = `{"http":200,"code":"SUCCESS","outcome":"applied","status":"PAID"}`
	const skipped = `{"http":200,"code":"SUCCESS","outcome":"skipped","status":"PAID"}`
	for _, o := range []struct{ no, status string }{
		{"U-paid", "PAID"}, {"U-shipped", "SHIPPED"}, {"U-refunded", "REFUNDED"}, {"U-colon", "PAID"},
		{"U-noclaim", "PAID"}, {"U-refunded-noclaim", "REFUNDED"}, {"U-pending", "PENDING_PAY"}, {"U-closed", "CLOSED"},
	} {
		exec(`INSERT INTO biz_order (order_no, status, amount, currency) VALUES ($1, $2, 1999, 'CNY')`, o.no, o.status)
	}
	for _, c := range []struct{ key, order, result string }{
		{"acme:TX1:PAY_SUCCESS", "U-paid", applied},
		{"acme:TX2:PAY_SUCCESS", "U-shipped", applied},
		{"acme:TX9:PAY_SUCCESS", "U-shipped", skipped}, // its second payment: not the payer
		{"wechatpay:W3:PAY_SUCCESS", "U-refunded", applied},
		{"wechatpay:W3:REFUND_SUCCESS", "U-refunded", applied},
		{"acme:a:b:c:PAY_SUCCESS", "U-colon", applied}, // a txn id may hold colons
		{"acme:TX5:PAY_SUCCESS", "U-closed", `{"http":200,"code":"SUCCESS","outcome":"skipped","status":"CLOSED"}`},
		{"acme:TX6:PAY_CLOSED", "U-pending", `{"http":200,"code":"SUCCESS","outcome":"skipped","status":"PENDING_PAY"}`},
	} {
		exec(`INSERT INTO notify_claim (biz_key, order_no, payload_hash, claim_state, result_json)
			VALUES ($1, $2, repeat('a', 64), 'DONE', $3)`, c.key, c.order, c.result)
	}

	if err := durable.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	type money struct {
		payer    string
		refunded int64
		refunds  []refund
	}
	check := func(when string, want map[string]money) {
		t.Helper()
		for no, w := range want {
			payer, refunded, refunds := b.money(t, no)
			if d := cmp.Diff(w, money{payer, refunded, refunds}, cmp.AllowUnexported(money{})); d != "" {
				t.Errorf("%s: %s (-want +got):\n%s", when, no, d)
			}
		}
	}
	upgraded := map[string]money{
		"U-paid":             {payer: "acme:TX1"},
		"U-shipped":          {payer: "acme:TX2"},
		"U-refunded":         {payer: "wechatpay:W3", refunded: 1999, refunds: []refund{{"wechatpay:W3", "", 1999}}},
		"U-colon":            {payer: "acme:a:b:c"},
		"U-noclaim":          {},
		"U-refunded-noclaim": {refunded: 1999},
		"U-pending":          {},
		"U-closed":           {},
	}
	check("after the upgrade", upgraded)

	// Down to 3 and up again: the migration runs again from scratch.
	if err := durable.MigrateTo(ctx, url, 3); err != nil {
		t.Fatal(err)
	}
	if err := durable.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	check("after down and up again", upgraded)

	// The upgraded orders are decided by the trade from now on.
	b.store = newStore(t, url, durable.Config{})
	steps := []struct {
		n       durable.Notification
		outcome durable.Outcome
		status  durable.State
		review  durable.ReviewReason
	}{
		{chNote("acme", "TX1", durable.PaySuccess, "U-paid", 1999, "", 0, false), durable.Skipped, durable.Paid, ""},
		{rf("acme", "TX1", "R1", 999)("U-paid", 1999), durable.Applied, durable.Paid, ""},
		{rf("acme", "NEW", "R2", 999)("U-noclaim", 1999), durable.Applied, durable.Paid, ""}, // adopts acme:NEW
		{rf("acme", "OTHER", "R3", 1000)("U-noclaim", 1999), durable.Skipped, durable.Paid, durable.ReviewRefundOtherTrade},
		{rf("wechatpay", "W4", "R4", 500)("U-refunded-noclaim", 1999), durable.Skipped, durable.Refunded, ""}, // adopts, itemises
		{rf("wechatpay", "W3", "R5", 1999)("U-refunded", 1999), durable.Skipped, durable.Refunded, ""},
	}
	// The payer's late duplicate (the first step) comes after retention took
	// its claim: skipped, no alarm.
	b.forget(t, "acme:TX1:PAY_SUCCESS")
	for i, s := range steps {
		got := process(t, b.store, s.n)
		if got.Outcome != s.outcome || got.Status != s.status || got.Review != s.review {
			t.Errorf("step %d (%s): got %v/%s/review %q, want %v/%s/review %q", i, s.n.BizKey,
				got.Outcome, got.Status, got.Review, s.outcome, s.status, s.review)
		}
	}
	check("after deliveries", map[string]money{
		"U-paid":    {payer: "acme:TX1", refunded: 999, refunds: []refund{{"acme:TX1", "R1", 999}}},
		"U-noclaim": {payer: "acme:NEW", refunded: 999, refunds: []refund{{"acme:NEW", "R2", 999}, {"acme:OTHER", "R3", 1000}}},
		"U-refunded-noclaim": {payer: "wechatpay:W4", refunded: 1999,
			refunds: []refund{{"wechatpay:W4", "", 1499}, {"wechatpay:W4", "R4", 500}}},
		"U-refunded": {payer: "wechatpay:W3", refunded: 1999,
			refunds: []refund{{"wechatpay:W3", "", 0}, {"wechatpay:W3", "R5", 1999}}},
	})
	if n := b.count(t, `SELECT count(*) FROM notify_review WHERE reason = 'DUPLICATE_PAYMENT'`); n != 0 {
		t.Errorf("%d DUPLICATE_PAYMENT rows: the payer's late duplicate raised an alarm", n)
	}
}

// A database of the build before event ids (schema version 11), with
// outbox rows published and not: the upgrade gives each row still to be
// published an event id of its own (a UUID version 7), leaves the published
// ones without, and every row written after it has one.
func TestUpgradeGivesUnpublishedRowsEventIDs(t *testing.T) {
	ctx := context.Background()
	url := durabletestCreateEmpty(t)
	if err := durable.MigrateTo(ctx, url, 11); err != nil {
		t.Fatal(err)
	}
	db := durabletest.Pool(t, url)
	if _, err := db.Exec(ctx, `INSERT INTO outbox (topic, order_no, payload, published_at)
		SELECT 'ORDER_PAID', 'E-' || g, '{}', CASE WHEN g % 2 = 0 THEN now() END FROM generate_series(1, 10) g`); err != nil {
		t.Fatal(err)
	}
	if err := durable.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, `INSERT INTO outbox (topic, order_no, payload) VALUES ('ORDER_PAID', 'E-new', '{}')`); err != nil {
		t.Fatal(err)
	}
	var published, unpublished, distinct, v7 int
	if err := db.QueryRow(ctx, `SELECT count(*) FILTER (WHERE published_at IS NOT NULL AND event_id IS NULL),
		       count(*) FILTER (WHERE published_at IS NULL AND event_id IS NOT NULL),
		       count(DISTINCT event_id), count(*) FILTER (WHERE substr(event_id::text, 15, 1) = '7')
		  FROM outbox`).Scan(&published, &unpublished, &distinct, &v7); err != nil {
		t.Fatal(err)
	}
	if published != 5 || unpublished != 6 || distinct != 6 || v7 != 6 {
		t.Errorf("published without id %d (want 5), unpublished with one %d (6), distinct %d (6), version 7 %d (6)", published, unpublished, distinct, v7)
	}
}
