package query_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/notifyedge/notifyedge/edge/reconcile/query"
	"github.com/notifyedge/notifyedge/edge/reconcile/query/querytest"
)

// Several fakes run in one process on ports of their own, and a querier
// serves concurrent queries; each fake counts exactly its own requests.
func TestConcurrentQueriesAndFakes(t *testing.T) {
	const perQuerier, workers = 12, 4
	type target struct {
		q    query.Querier
		fake interface{ Requests() int }
		set  func(orderNo string)
	}
	var targets []target
	for range 2 {
		wx := newWeChat(t, false, nil)
		targets = append(targets, target{wx.q, wx.fake, func(o string) {
			wx.fake.SetTrade(o, querytest.Trade{State: "SUCCESS", TxnID: "TX-" + o, Amount: 100})
		}})
		ali := newAlipay(t, false, nil)
		targets = append(targets, target{ali.q, ali.fake, func(o string) {
			ali.fake.SetTrade(o, querytest.Trade{State: "TRADE_SUCCESS", TxnID: "TN-" + o, Amount: 100})
		}})
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(targets)*perQuerier)
	for ti, tg := range targets {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < perQuerier; i += workers {
					orderNo := fmt.Sprintf("C-%d-%d", ti, i)
					tg.set(orderNo)
					a, err := queryNow(t, tg.q, orderNo)
					if err == nil && a.State != query.Paid {
						err = fmt.Errorf("%s: %s", orderNo, a.State)
					}
					if err != nil {
						errs <- err
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for ti, tg := range targets {
		if n := tg.fake.Requests(); n != perQuerier {
			t.Errorf("fake %d counted %d requests, want %d", ti, n, perQuerier)
		}
	}
}
