package claimcache

import "strconv"

// What a claim decides: the verdicts and the values they carry.

// Verdict is what a claim found.
type Verdict uint8

// The claim verdicts.
const (
	// Won: this request now holds a pending entry; it must Complete (after a
	// committed DONE result) or Abort.
	Won Verdict = iota + 1
	// Done: a finished entry with the same digest exists; Response is the
	// first answer.
	Done
	// Mismatch: an entry with another digest exists; Postgres decides
	// (it records the conflict).
	Mismatch
	// Busy: another owner's pending entry with the same digest exists; Wait
	// for its result.
	Busy
)

var verdictNames = [...]string{Won: "won", Done: "done", Mismatch: "mismatch", Busy: "busy"}

func (v Verdict) String() string {
	if int(v) < len(verdictNames) && verdictNames[v] != "" {
		return verdictNames[v]
	}
	return "Verdict(" + strconv.Itoa(int(v)) + ")"
}

// Digest is the raw SHA-256 of a delivery's business fields.
type Digest [32]byte

// Token identifies the owner of a pending entry.
type Token [16]byte

// Result is a claim's outcome.
type Result struct {
	Verdict Verdict
	// Token is the owner token of a Won claim.
	Token Token
	// Response is the stored response of a Done verdict. It is a fresh
	// string from the Redis reply: the caller may keep it.
	Response string
	// Epoch names the cache epoch a Won claim was made under (for
	// Completion.Epoch).
	Epoch uint64
}
