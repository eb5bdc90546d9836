package claimcachetest

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Cluster is a real Redis Cluster on loopback: masters with one replica
// each, every node a redis-server of its own (a Server), formed with
// redis-cli --cluster create.
type Cluster struct {
	// Nodes are every node, masters first as created (a failover may swap
	// roles since: ask Masters).
	Nodes []*Server
}

// ErrNoCLI is returned when redis-cli is not installed.
var ErrNoCLI = errors.New("redis-cli not found: install it with 'apt-get install redis-tools'")

// StartCluster starts masters × (1 + replicas) nodes on free ports and
// forms a cluster of them, returning once every slot is served and every
// replica has synced. nodeTimeout is cluster-node-timeout: how long a
// silent master stays a master (a failover takes about twice it).
func StartCluster(ctx context.Context, masters, replicas int, nodeTimeout time.Duration) (*Cluster, error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, ErrNoCLI
	}
	c := &Cluster{}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	for range masters * (1 + replicas) {
		s, err := Start("--cluster-enabled", "yes", "--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10),
			"--cluster-replica-validity-factor", "0", "--cluster-require-full-coverage", "no", "--appendonly", "yes")
		if err != nil {
			return nil, err
		}
		// Its nodes.conf lands in its own directory (redis-server works in
		// --dir) and goes when the node is stopped.
		c.Nodes = append(c.Nodes, s)
	}
	args := []string{"--cluster", "create"}
	for _, s := range c.Nodes {
		args = append(args, s.Addr())
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// Addrs are the nodes' host:port.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		out[i] = s.Addr()
	}
	return out
}

// URL is the cluster form of REDIS_URL: redis://first?addr=second&addr=...
func (c *Cluster) URL() string {
	addrs := c.Addrs()
	return "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
}

// Client returns a plain cluster client, for tests to look inside.
func (c *Cluster) Client() *redis.ClusterClient {
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second})
}

// node returns the Server listening at addr.
func (c *Cluster) node(addr string) *Server {
	for _, s := range c.Nodes {
		if s.Addr() == addr {
			return s
		}
	}
	return nil
}

// MasterOf returns the node that serves key now (its slot's master).
func (c *Cluster) MasterOf(ctx context.Context, key string) (*Server, error) {
	cc := c.Client()
	defer cc.Close()
	m, err := cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("master for %q: %w", key, err)
	}
	s := c.node(m.Options().Addr)
	if s == nil {
		return nil, fmt.Errorf("master for %q is %s, not a node of the cluster", key, m.Options().Addr)
	}
	return s, nil
}

// ReplicaOf returns a live replica of master.
func (c *Cluster) ReplicaOf(ctx context.Context, master *Server) (*Server, error) {
	host, port, _ := strings.Cut(master.Addr(), ":")
	for _, s := range c.Nodes {
		if s == master || !s.alive() {
			continue
		}
		rc := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
		info, err := rc.Info(ctx, "replication").Result()
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.Addr(), err)
		}
		if strings.Contains(info, "master_host:"+host+"\r\n") && strings.Contains(info, "master_port:"+port+"\r\n") {
			return s, nil
		}
	}
	return nil, fmt.Errorf("no live replica of %s", master.Addr())
}

// WaitHealthy waits until a live node reports cluster_state:ok, every
// slot assigned and served, and every live replica's link to its master up.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if last = c.health(ctx); last == "" {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("redis cluster not healthy after 30 s: %s", last)
}

// health returns "" when the cluster is whole, else what is not.
func (c *Cluster) health(ctx context.Context) string {
	for _, s := range c.Nodes {
		if !s.alive() {
			continue
		}
		rc := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
		info, err := rc.ClusterInfo(ctx).Result()
		repl, rerr := rc.Info(ctx, "replication").Result()
		rc.Close()
		if err != nil || rerr != nil {
			return fmt.Sprintf("%s: %v %v", s.Addr(), err, rerr)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_slots_ok:16384") {
			return s.Addr() + ": " + strings.ReplaceAll(info, "\r\n", " ")
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			return s.Addr() + ": replica not synced"
		}
	}
	return ""
}

// Stop stops every node and removes their directories.
func (c *Cluster) Stop() {
	for _, s := range c.Nodes {
		s.Stop()
	}
}
