package claimcachetest

import (
	"errors"
	"net"
	"testing"
)

// A port taken between the check and the server's bind: the server exits
// at start, and Start tries again on another port.
func TestStartTriesAnotherPortWhenOneIsTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	orig := freePort
	defer func() { freePort = orig }()
	handed := 0
	freePort = func() (int, error) {
		handed++
		if handed == 1 {
			return taken.Addr().(*net.TCPAddr).Port, nil
		}
		return orig()
	}
	s, err := Start()
	if errors.Is(err, ErrNoServer) {
		t.Skip("no redis-server")
	}
	if err != nil {
		t.Fatalf("Start with the first port taken: %v", err)
	}
	defer s.Stop()
	if handed != 2 || s.Addr() == taken.Addr().String() {
		t.Errorf("ports handed out %d, server at %s (taken: %s)", handed, s.Addr(), taken.Addr())
	}
}
