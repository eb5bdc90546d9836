package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/notifyedge/notifyedge/durable/wait"
)

// HAProxy in front of the nodes, configured as the production guide says.

// startHAProxy writes its configuration and starts it: one frontend with
// node 1 behind it, one with all three.
func (st *scaleStack) startHAProxy(ctx context.Context) error {
	one, three := freeAddr(), freeAddr()
	var b strings.Builder
	fmt.Fprintf(&b, `global
    maxconn 4096
defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
    # A POST is retried on another node only when the connection to its
    # node failed: it never reached edged. Any answer edged gave, 503
    # included, goes back to the channel, which retries on its own.
    retries 3
    retry-on conn-failure
    option redispatch
frontend one
    bind %s
    default_backend one
frontend three
    bind %s
    default_backend three
`, one, three)
	for _, be := range []struct {
		name  string
		nodes int
	}{{"one", 1}, {"three", 3}} {
		fmt.Fprintf(&b, "backend %s\n    balance roundrobin\n    option httpchk GET /readyz\n    http-check expect status 200\n", be.name)
		for i := range be.nodes {
			_, admPort, _ := net.SplitHostPort(st.admAddr[i])
			fmt.Fprintf(&b, "    server n%d %s check port %s inter 500ms fall 2 rise 2\n", i+1, st.edgeAddrs[i], admPort)
		}
	}
	path := filepath.Join(st.dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return err
	}
	var err error
	if st.haproxy, err = st.startProc("haproxy", "haproxy", []string{"-f", path, "-db"}, nil); err != nil {
		return err
	}
	st.one, st.three = "http://"+one, "http://"+three
	// Up once its checks have seen the nodes (rise 2 at 500 ms): any answer
	// but haproxy's own 503 comes from an edged.
	wait.Sleep(ctx, 1500*time.Millisecond)
	return waitInRotation(ctx, st.three)
}

// waitInRotation waits, up to 20 s, until haproxy's frontend at url has an
// edged in rotation: any answer but haproxy's own 503 comes from one.
func waitInRotation(ctx context.Context, url string) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if resp, err := http.Get(url + "/"); err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				return nil
			}
		}
		wait.Sleep(ctx, 100*time.Millisecond)
	}
	return errors.New("haproxy saw no healthy edged within 20 s")
}
