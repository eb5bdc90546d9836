// Package edgetest is the tests' kit beside the poller (durable/wait.For):
// a log sink safe for many goroutines, a scrape of /metrics and the value
// of one series on it, each written once. Only tests import it.
package edgetest

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Log is a log sink that the code under test writes from its goroutines
// while the test reads it.
type Log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String is everything written so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Len is how many bytes were written so far.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Len()
}

// Scrape returns the page at url (a /metrics), failing t when it cannot be
// read.
func Scrape(t testing.TB, client *http.Client, url string) string {
	t.Helper()
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Value is the value of the series named exactly (name and labels, as the
// page writes them) on a metrics page; ok is false when the page has no
// such series.
func Value(page, series string) (v float64, ok bool) {
	for line := range strings.Lines(page) {
		if s, found := strings.CutPrefix(strings.TrimSpace(line), series+" "); found {
			f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
			return f, err == nil
		}
	}
	return 0, false
}
