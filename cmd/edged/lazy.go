package main

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/notifyedge/notifyedge/durable"
)

// errStarting answers what needs Postgres while edged still waits for it.
var errStarting = errors.New("edged is starting: Postgres is not ready yet")

// lazyStore stands for the durable.Store that exists once Postgres is
// ready, so that the admin listener (health, readiness, metrics) can serve
// from the first moment: until then every call is errStarting. The public
// listener opens only after the store is set, so callbacks never see it.
type lazyStore struct {
	p atomic.Pointer[durable.Store]
}

func (l *lazyStore) set(s *durable.Store) { l.p.Store(s) }

// starting reports whether the store is not there yet.
func (l *lazyStore) starting() bool { return l.p.Load() == nil }

func (l *lazyStore) get() (*durable.Store, error) {
	if s := l.p.Load(); s != nil {
		return s, nil
	}
	return nil, errStarting
}

func (l *lazyStore) Process(ctx context.Context, n durable.Notification) (durable.Result, error) {
	s, err := l.get()
	if err != nil {
		return durable.Result{}, err
	}
	return s.Process(ctx, n)
}

func (l *lazyStore) RecordReview(ctx context.Context, n durable.Notification, r durable.ReviewReason) error {
	s, err := l.get()
	if err != nil {
		return err
	}
	return s.RecordReview(ctx, n, r)
}

func (l *lazyStore) Ping(ctx context.Context) error {
	s, err := l.get()
	if err != nil {
		return err
	}
	return s.Ping(ctx)
}

func (l *lazyStore) Reviews(ctx context.Context, q durable.ReviewQuery) ([]durable.Review, error) {
	s, err := l.get()
	if err != nil {
		return nil, err
	}
	return s.Reviews(ctx, q)
}

func (l *lazyStore) Review(ctx context.Context, id int64) (durable.Review, error) {
	s, err := l.get()
	if err != nil {
		return durable.Review{}, err
	}
	return s.Review(ctx, id)
}

func (l *lazyStore) ResolveReview(ctx context.Context, id int64, resolution, by string) (durable.Review, error) {
	s, err := l.get()
	if err != nil {
		return durable.Review{}, err
	}
	return s.ResolveReview(ctx, id, resolution, by)
}

func (l *lazyStore) ResolveRedriven(ctx context.Context, id int64, resolution, by string) (bool, error) {
	s, err := l.get()
	if err != nil {
		return false, err
	}
	return s.ResolveRedriven(ctx, id, resolution, by)
}

func (l *lazyStore) OpenReviews(ctx context.Context) (map[durable.ReviewReason]int64, error) {
	s, err := l.get()
	if err != nil {
		return nil, err
	}
	return s.OpenReviews(ctx)
}

func (l *lazyStore) OutboxBacklog(ctx context.Context) (durable.Backlog, error) {
	s, err := l.get()
	if err != nil {
		return durable.Backlog{}, err
	}
	return s.OutboxBacklog(ctx)
}

func (l *lazyStore) PutOrder(ctx context.Context, orderNo string, amount int64, currency string) (bool, error) {
	s, err := l.get()
	if err != nil {
		return false, err
	}
	return s.PutOrder(ctx, orderNo, amount, currency)
}

func (l *lazyStore) PatchOrder(ctx context.Context, orderNo string, amount int64, currency string) error {
	s, err := l.get()
	if err != nil {
		return err
	}
	return s.PatchOrder(ctx, orderNo, amount, currency)
}

func (l *lazyStore) OrderHistory(ctx context.Context, orderNo string, limit int) (durable.OrderHistory, error) {
	s, err := l.get()
	if err != nil {
		return durable.OrderHistory{}, err
	}
	return s.OrderHistory(ctx, orderNo, limit)
}

func (l *lazyStore) OrderEvent(ctx context.Context, orderNo string, e durable.Event, requestID string) (durable.Result, error) {
	s, err := l.get()
	if err != nil {
		return durable.Result{}, err
	}
	return s.OrderEvent(ctx, orderNo, e, requestID)
}
