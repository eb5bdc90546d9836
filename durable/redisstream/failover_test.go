package redisstream_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/notifyedge/notifyedge/claimcache/claimcachetest"
	"github.com/notifyedge/notifyedge/durable/durabletest"
	"github.com/notifyedge/notifyedge/durable/redisstream"
	"github.com/notifyedge/notifyedge/durable/wait"
)

// The stream's master dies right after entries it acknowledged, before its
// replica had them (the replica frozen, its link dropped, then the master
// SIGKILLed and the replica promoted). With Replicas 1 the relay
// marks rows published only once the replica holds them (WAIT): after the
// failover every published row is on the promoted replica, and the rest
// are still unpublished in the outbox, to go again.
func TestStreamSurvivesMasterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster and waits for a failover")
	}
	replicas := 1
	if v := os.Getenv("NOTIFYEDGE_TEST_STREAM_REPLICAS"); v != "" { // 0 shows the loss this prevents
		replicas, _ = strconv.Atoi(v)
	}
	ctx := context.Background()
	cl, err := claimcachetest.StartCluster(ctx, 3, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Stop)
	client, err := redisstream.NewClient(cl.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	url := durabletest.NewDatabase(t)
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	b := &bundle{url: url, store: newStore(t, url), db: db, client: client}

	master, err := cl.MasterOf(ctx, redisstream.DefaultStream)
	if err != nil {
		t.Fatal(err)
	}
	replica, err := cl.ReplicaOf(ctx, master)
	if err != nil {
		t.Fatal(err)
	}
	pub := redisstream.NewPublisher(client, "", 0)
	pub.Replicas, pub.ReplicaTimeout = replicas, 300*time.Millisecond
	stop := runRelay(t, b.store, pub, nil)
	b.paidAndRefunded(t, "F", 20, false) // published while the replica keeps up
	b.waitPublished(t)

	// The replica is frozen and its link dropped: what the master
	// acknowledges from now on never leaves it. Then the master dies and
	// the replica, thawed, is promoted without those entries.
	replica.Pause()
	mc := redis.NewClient(&redis.Options{Addr: master.Addr()})
	t.Cleanup(func() { mc.Close() })
	if err := mc.ClientKillByFilter(ctx, "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
	b.paidAndRefunded(t, "G", 40, false)
	// The relay publishes them to the master (then, with Replicas, waits
	// for the frozen replica in vain): every row is on the master.
	wait.For(t, "every outbox row on the master", func() (bool, string) {
		msgs, err := mc.XRange(ctx, redisstream.DefaultStream, "-", "+").Result()
		if err != nil {
			return false, err.Error()
		}
		onMaster := map[string]bool{}
		for _, m := range msgs {
			onMaster[fmt.Sprint(m.Values[redisstream.FieldOutboxID])] = true
		}
		var missing []int64
		rows, err := db.Query(ctx, `SELECT id FROM outbox ORDER BY id`)
		if err != nil {
			return false, err.Error()
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			return false, err.Error()
		}
		for _, id := range ids {
			if !onMaster[strconv.FormatInt(id, 10)] {
				missing = append(missing, id)
			}
		}
		return len(missing) == 0, fmt.Sprintf("%d of %d rows not on the master (first few: %v)", len(missing), len(ids), missing[:min(len(missing), 5)])
	})
	master.Kill()
	replica.Resume()
	if err := cl.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	stop()
	// The client finds the promoted replica when it next reads the slot
	// map (every second): until then it may still dial the dead master.
	wait.For(t, "the stream readable after the failover", func() (bool, string) {
		if err := client.XLen(ctx, redisstream.DefaultStream).Err(); err != nil {
			return false, err.Error()
		}
		return true, ""
	})

	inStream := map[int64]bool{}
	all, _ := b.streamIDs(t)
	for _, id := range all {
		inStream[id] = true
	}
	rows, err := db.Query(ctx, `SELECT id FROM outbox WHERE published_at IS NOT NULL ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var published, lost []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		published = append(published, id)
		if !inStream[id] {
			lost = append(lost, id)
		}
	}
	rows.Close()
	unpublished := b.count(t, `SELECT count(*) FROM outbox WHERE published_at IS NULL`)
	t.Logf("Replicas %d: %d rows marked published, %d unpublished, %d entries on the promoted replica", replicas, len(published), unpublished, len(all))
	if len(lost) > 0 {
		t.Errorf("%d rows marked published are not on the promoted replica (first: outbox id %d)", len(lost), lost[0])
	}
	if unpublished == 0 {
		t.Error("every row was marked published although the replica was stalled when the master died")
	}
}
