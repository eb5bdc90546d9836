package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/notifyedge/notifyedge/edge/readiness"
)

// startReadiness runs the probes /readyz reports, from now until Close:
// Postgres (once it first answered) and the cache's Redis, and, with a
// cache, the record in its Redis of which node last reached Postgres when,
// which tells a database every node lost from one this node alone lost.
func (m *Main) startReadiness(redisState func() string) *readiness.Checker {
	cfg := readiness.Config{
		Node:  nodeName(),
		Redis: redisState,
		Postgres: func(ctx context.Context) error {
			store := m.ready.Load()
			if store == nil {
				return errStarting
			}
			return store.Ping(ctx)
		},
	}
	if m.redis != nil {
		cfg.Peers = readiness.RedisPeers{Client: m.redis}
	}
	checker := readiness.New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	m.stopReadiness, m.readinessDone = cancel, make(chan struct{})
	go func() {
		defer close(m.readinessDone)
		checker.Run(ctx)
	}()
	return checker
}

// nodeName names this process among the nodes: the host, the process id
// and a random part, so that a restart is a new node.
func nodeName() string {
	host, _ := os.Hostname()
	var b [4]byte
	rand.Read(b[:]) // never fails
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}
