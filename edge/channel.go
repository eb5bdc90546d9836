package edge

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
)

// HeaderReader reads request headers. *fasthttp.RequestHeader satisfies it;
// the returned bytes are valid only while the request is being handled.
type HeaderReader interface {
	Peek(name string) []byte
}

// Request is the transport-neutral view of one callback. Every byte slice
// it holds (and that HeaderReader returns) is request-scoped: valid only
// until the handler returns.
type Request struct {
	// Channel is the {channel} path segment.
	Channel []byte
	// ContentType is the Content-Type header.
	ContentType []byte
	// Body is the raw body as received.
	Body []byte
	// Header reads the other headers.
	Header HeaderReader
}

// Delivery is what a channel adapter extracts from a Request: the business
// fields, the idempotency key and the digest. Adapters fill it in place; the
// flow resets it between requests. Field slices may alias the request body
// or the Delivery's own scratch, so they are request-scoped.
type Delivery struct {
	TxnID    []byte // channel transaction id (refund id for refunds)
	OrderNo  []byte
	Event    []byte // the contract's event name, e.g. PAY_SUCCESS
	Amount   int64  // minor units
	Currency []byte
	// Key is "{channel}:{txn id}:{event}" and Digest the lower-case hex
	// SHA-256 of the business fields; Finish computes both.
	Key    []byte
	Digest [64]byte
	// Sum is the raw digest (the cache's form).
	Sum [sha256.Size]byte

	scratch  []byte   // adapters' decode space (escaped JSON strings, decrypted resources)
	keys     [][]byte // top-level JSON keys seen, to refuse repeats
	digestIn []byte   // the digest's preimage
	macs     [maxSecrets][sha256.Size]byte
}

// maxSecrets is how many secrets a channel may hold at once (rotation).
const maxSecrets = 8

// Reset empties d for reuse, keeping its buffers.
func (d *Delivery) Reset() {
	d.TxnID, d.OrderNo, d.Event, d.Currency, d.Amount = nil, nil, nil, nil, 0
	d.Key, d.scratch, d.keys, d.digestIn = d.Key[:0], d.scratch[:0], d.keys[:0], d.digestIn[:0]
}

// keep copies s into d's scratch and returns the copy (request-scoped, like
// every Delivery field).
func (d *Delivery) keep(s string) []byte {
	start := len(d.scratch)
	d.scratch = append(d.scratch, s...)
	return d.scratch[start:len(d.scratch):len(d.scratch)]
}

// Finish computes the key and the digest of the contract from the business
// fields, for channel name ch:
//
//	biz_key = "{channel}:{channel_txn_id}:{event_type}"
//	digest  = hex(sha256(txn "\n" event "\n" order_no "\n" amount "\n" currency))
//
// Every build computes the same digest, so a rolling deploy never turns a
// retry into a conflict.
func (d *Delivery) Finish(ch string) {
	d.Key = append(d.Key[:0], ch...)
	d.Key = append(d.Key, ':')
	d.Key = append(d.Key, d.TxnID...)
	d.Key = append(d.Key, ':')
	d.Key = append(d.Key, d.Event...)
	in := append(d.digestIn[:0], d.TxnID...)
	in = append(in, '\n')
	in = append(in, d.Event...)
	in = append(in, '\n')
	in = append(in, d.OrderNo...)
	in = append(in, '\n')
	in = strconv.AppendInt(in, d.Amount, 10)
	in = append(in, '\n')
	in = append(in, d.Currency...)
	d.digestIn = in
	d.Sum = sha256.Sum256(in)
	hex.Encode(d.Digest[:], d.Sum[:])
}

// Reject is an adapter's refusal of a request: a 4xx answer that stores
// nothing (or, for a merchant mismatch, a review row).
type Reject struct {
	Outcome Outcome
	Message string
}

func (r *Reject) Error() string { return r.Outcome.String() + ": " + r.Message }

// badRequest returns the 400 rejection for a malformed field.
func badRequest(format string, args ...any) *Reject {
	return &Reject{Outcome: OutcomeBadRequest, Message: fmt.Sprintf(format, args...)}
}

// unauthorized returns the 401 rejection.
func unauthorized(msg string) *Reject {
	return &Reject{Outcome: OutcomeBadSignature, Message: msg}
}

// Channel is one configured payment channel: its adapter. Implementations
// are one file each (channel_<kind>.go); the flow does not change when one
// is added.
type Channel interface {
	// Name is the channel's name as in the path and biz_key.
	Name() string
	// Parse authenticates req and fills d, then calls d.Finish. It returns
	// a *Reject for a request to refuse (401, 400, 422 merchant mismatch).
	// It must not keep req or d's slices after it returns.
	Parse(req *Request, d *Delivery) *Reject
	// Render appends the channel's acknowledgement of v to dst and returns
	// it with the content type. It must be deterministic: replays of a
	// stored result render byte for byte the first answer.
	Render(dst []byte, v *Verdict) (body []byte, contentType string)
}
