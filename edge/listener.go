package edge

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// connLimiter caps the connections a listener hands out: in all, and per
// client address. fasthttp has both caps, but its refusals are plain text
// written from its accept loop; here they are the answers' JSON, written
// with a short deadline so that a client that does not read cannot stall
// the accept loop.
//
// A connection counts from Accept until Close. Keep-alive connections that
// send nothing are closed by the server's idle timeout, so a client that
// opens connections and idles holds at most perIP slots, briefly.
type connLimiter struct {
	net.Listener
	max, perIP int // 0: no cap
	refused    func(reason string)

	total atomic.Int64
	mu    sync.Mutex
	byIP  map[string]int
}

// The canned refusals: the answers' JSON, then the connection is closed.
var (
	refusePerIP = cannedRefusal(429, "Too Many Requests", "too many connections from this address; retry later")
	refuseTotal = cannedRefusal(503, "Service Unavailable", "too many connections; retry later")
)

func cannedRefusal(status int, text, msg string) []byte {
	body := `{"code":"FAIL","message":"` + msg + `"}`
	return []byte("HTTP/1.1 " + strconv.Itoa(status) + " " + text + "\r\n" +
		"Content-Type: application/json\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

// newConnLimiter wraps ln; refused (may be nil) counts each refusal by
// reason ("per_ip", "total").
func newConnLimiter(ln net.Listener, max, perIP int, refused func(string)) *connLimiter {
	return &connLimiter{Listener: ln, max: max, perIP: perIP, refused: refused, byIP: map[string]int{}}
}

// Accept returns the next connection within the caps, refusing the others.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := remoteIP(c)
		if n := l.total.Add(1); l.max > 0 && n > int64(l.max) {
			l.total.Add(-1)
			l.refuse(c, refuseTotal, "total")
			continue
		}
		if l.perIP > 0 && !l.takeIP(ip) {
			l.total.Add(-1)
			l.refuse(c, refusePerIP, "per_ip")
			continue
		}
		return &limitedConn{Conn: c, l: l, ip: ip}, nil
	}
}

func (l *connLimiter) takeIP(ip string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byIP[ip] >= l.perIP {
		return false
	}
	l.byIP[ip]++
	return true
}

func (l *connLimiter) release(ip string) {
	l.total.Add(-1)
	if l.perIP == 0 {
		return
	}
	l.mu.Lock()
	if n := l.byIP[ip] - 1; n > 0 {
		l.byIP[ip] = n
	} else {
		delete(l.byIP, ip)
	}
	l.mu.Unlock()
}

// refuse writes the canned answer (without reading the request: the
// client's bytes are never looked at) and closes.
func (l *connLimiter) refuse(c net.Conn, answer []byte, reason string) {
	_ = c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	_, _ = c.Write(answer)
	_ = c.Close()
	if l.refused != nil {
		l.refused(reason)
	}
}

// remoteIP is the connection's client address without the port; the whole
// address for anything that is not TCP (in-memory listeners in tests).
func remoteIP(c net.Conn) string {
	a := c.RemoteAddr()
	if t, ok := a.(*net.TCPAddr); ok {
		return string(t.IP.To16())
	}
	return a.String()
}

// limitedConn gives its slot back once, on the first Close.
type limitedConn struct {
	net.Conn
	l      *connLimiter
	ip     string
	closed atomic.Bool
}

func (c *limitedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.release(c.ip)
	}
	return c.Conn.Close()
}
