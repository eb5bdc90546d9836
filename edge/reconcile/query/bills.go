package query

import (
	"compress/flate"
	"compress/gzip"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/go-pay/gopay"
	"github.com/go-pay/gopay/alipay"
	"github.com/wechatpay-apiv3/wechatpay-go/core"

	"github.com/notifyedge/notifyedge/edge/reconcile/bill"
)

// ErrNotReady means the channel has not made the day's statement yet
// (WeChat STATEMENT_CREATING; Alipay isp.bill_not_exist, which Alipay also
// answers for a day it has no statement of): ask again later.
var ErrNotReady = errors.New("the channel's statement of that day is not ready")

// Statement is a day's statement as it is being read: rows come from the
// channel's connection (or a temporary file) as Next asks for them. Close
// releases it.
type Statement struct {
	bill.Reader
	io.Closer
}

// Biller fetches a day's statement (YYYY-MM-DD, the channel's day).
type Biller interface {
	Bill(ctx context.Context, date string) (Statement, error)
}

// DefaultBillTimeout bounds fetching and reading one statement.
const DefaultBillTimeout = 30 * time.Minute

// maxBillFile bounds a downloaded statement kept on disk (Alipay's zip).
const maxBillFile = 4 << 30

// validDate checks a bill date.
func validDate(date string) error {
	if _, err := time.Parse(time.DateOnly, date); err != nil {
		return fmt.Errorf("bill date %q: want YYYY-MM-DD", printable(date))
	}
	return nil
}

// emptyStatement is a day the channel has no statement of: no rows.
type emptyStatement struct{}

func (emptyStatement) Next() (bill.Row, error) { return bill.Row{}, io.EOF }
func (emptyStatement) Totals() bill.Totals     { return bill.Totals{} }
func (emptyStatement) Close() error            { return nil }

// Empty is the statement of a day without trades.
var Empty = Statement{Reader: emptyStatement{}, Closer: emptyStatement{}}

// closers closes each in order, returning the first error.
type closers []func() error

func (c closers) Close() error {
	var first error
	for _, f := range c {
		if err := f(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Bill fetches WeChat Pay's trade bill of date: GET /v3/bill/tradebill
// (bill_type ALL, gzip) through the SDK's signed and verified client, then
// the file at download_url with a signed request whose answer is not
// signed, decompressed as it is read; at its end the SHA-1 of the
// decompressed bytes must equal hash_value, or the last read fails with
// ErrUnverified. NO_STATEMENT_EXIST (verified) is the empty statement,
// STATEMENT_CREATING ErrNotReady.
func (w *WeChat) Bill(ctx context.Context, date string) (Statement, error) {
	if err := validDate(date); err != nil {
		return Statement{}, fmt.Errorf("wechat pay bill: %w", err)
	}
	qctx, cancel := context.WithTimeout(ctx, w.cfg.Timeout)
	defer cancel()
	note := &verifyNote{}
	qctx = context.WithValue(qctx, verifyNoteKey{}, note)
	q := url.Values{"bill_date": {date}, "bill_type": {"ALL"}, "tar_type": {"GZIP"}}
	result, err := w.svc.Client.Get(qctx, DefaultWeChatBaseURL+"/v3/bill/tradebill?"+q.Encode())
	if err != nil {
		var apiErr *core.APIError
		switch {
		case errors.As(err, &apiErr) && (apiErr.Code == "NO_STATEMENT_EXIST" || apiErr.Code == "STATEMENT_CREATING"):
			// The SDK verifies only 2xx answers: this one is verified
			// here before it counts (an unsigned "no statement" must not
			// stand for a day without trades).
			if result == nil || result.Response == nil {
				return Statement{}, fmt.Errorf("wechat pay bill %s: a %s without its response", date, apiErr.Code)
			}
			if err := w.validator.Validate(qctx, result.Response); err != nil {
				return Statement{}, unverified("wechat pay bill "+date+": "+apiErr.Code, err)
			}
			if apiErr.Code == "STATEMENT_CREATING" {
				return Statement{}, fmt.Errorf("wechat pay bill %s: %w (STATEMENT_CREATING)", date, ErrNotReady)
			}
			return Empty, nil
		case errors.As(err, &apiErr):
			return Statement{}, fmt.Errorf("wechat pay bill %s: HTTP %d %s: %s", date, apiErr.StatusCode, printable(apiErr.Code), clip(apiErr.Message))
		case result != nil && result.Response != nil && !note.verified:
			return Statement{}, unverified("wechat pay bill "+date, err)
		}
		return Statement{}, fmt.Errorf("wechat pay bill %s: %w", date, err)
	}
	var ans struct {
		HashType    string `json:"hash_type"`
		HashValue   string `json:"hash_value"`
		DownloadURL string `json:"download_url"`
	}
	if err := json.NewDecoder(result.Response.Body).Decode(&ans); err != nil {
		return Statement{}, fmt.Errorf("wechat pay bill %s: the answer does not decode: %w", date, err)
	}
	want, err := hex.DecodeString(ans.HashValue)
	switch {
	case ans.HashType != "SHA1" || err != nil || len(want) != sha1.Size:
		return Statement{}, fmt.Errorf("wechat pay bill %s: hash_type %q with hash_value %q: want SHA1 and 40 hex digits", date,
			printable(ans.HashType), printable(ans.HashValue))
	case !strings.HasPrefix(ans.DownloadURL, "https://"):
		return Statement{}, fmt.Errorf("wechat pay bill %s: download_url is not https", date)
	}
	dctx, dcancel := context.WithTimeout(ctx, w.cfg.BillTimeout)
	res, err := w.download.Get(dctx, ans.DownloadURL)
	if err != nil {
		dcancel()
		var apiErr *core.APIError
		if errors.As(err, &apiErr) {
			return Statement{}, fmt.Errorf("wechat pay bill %s: the download: HTTP %d %s", date, apiErr.StatusCode, printable(apiErr.Code))
		}
		return Statement{}, fmt.Errorf("wechat pay bill %s: the download: %w", date, withoutURL(err))
	}
	body := res.Response.Body
	gz, err := gzip.NewReader(body)
	if err != nil {
		body.Close()
		dcancel()
		return Statement{}, fmt.Errorf("wechat pay bill %s: the file is not gzip: %w", date, err)
	}
	checked := &sha1Reader{r: gz, h: sha1.New(), want: want, date: date}
	return Statement{Reader: bill.NewWeChat(checked), Closer: closers{gz.Close, body.Close, func() error { dcancel(); return nil }}}, nil
}

// sha1Reader hashes what it reads and, at the end, fails unless the hash
// is want.
type sha1Reader struct {
	r    io.Reader
	h    hash.Hash
	want []byte
	date string
}

func (s *sha1Reader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	s.h.Write(p[:n])
	var corrupt flate.CorruptInputError
	if errors.Is(err, gzip.ErrChecksum) || errors.Is(err, gzip.ErrHeader) || errors.As(err, &corrupt) {
		// A file that does not decompress is not the file WeChat Pay
		// made: refused as a failed check, like a wrong SHA-1.
		return n, fmt.Errorf("wechat pay bill %s: %w: the file does not decompress: %v", s.date, ErrUnverified, err)
	}
	if errors.Is(err, io.EOF) {
		if got := s.h.Sum(nil); !equalBytes(got, s.want) {
			return n, fmt.Errorf("wechat pay bill %s: %w: the file's SHA-1 is %x, hash_value says %x", s.date, ErrUnverified, got, s.want)
		}
	}
	return n, err
}

func equalBytes(a, b []byte) bool { return string(a) == string(b) }

// alipayBillResponse is the member Alipay signs in the download URL's
// answer.
const alipayBillResponse = "alipay_data_dataservice_bill_downloadurl_query_response"

// Bill fetches Alipay's trade bill of date:
// alipay.data.dataservice.bill.downloadurl.query (bill_type trade) through
// gopay, its answer verified like a query's, then the zip at
// bill_download_url (good for 30 s: fetched at once) into a temporary
// file, whose 业务明细 CSV (not the 汇总 one) is read from GBK as it is
// asked for. isp.bill_not_exist (verified) is ErrNotReady: Alipay answers
// it both before the statement is made and for a day it never makes one.
func (a *Alipay) Bill(ctx context.Context, date string) (Statement, error) {
	if err := validDate(date); err != nil {
		return Statement{}, fmt.Errorf("alipay bill: %w", err)
	}
	qctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	raw := &capture{}
	qctx = context.WithValue(qctx, captureKey{}, raw)
	_, err := a.client.DataBillDownloadUrlQuery(qctx, make(gopay.BodyMap).Set("bill_type", "trade").Set("bill_date", date))
	if err != nil {
		bizErr, ok := alipay.IsBizError(err)
		if !ok {
			if errors.Is(err, gopay.UnmarshalErr) {
				return Statement{}, fmt.Errorf("alipay bill %s: the answer is not a %s", date, alipayBillResponse)
			}
			return Statement{}, fmt.Errorf("alipay bill %s: %w", date, err)
		}
		if bizErr.SubCode != "isp.bill_not_exist" {
			return Statement{}, fmt.Errorf("alipay bill %s: %s %s: %s", date, printable(bizErr.Code), printable(bizErr.SubCode), clip(bizErr.SubMsg))
		}
	}
	// Verified from the raw answer, as a query's is: the signed text is
	// the response member exactly as sent.
	content, sign, serr := alipaySigned(raw.body, alipayBillResponse)
	if serr != nil {
		return Statement{}, fmt.Errorf("alipay bill %s: %w: %v", date, ErrUnverified, serr)
	}
	if err := a.verify(content, sign); err != nil {
		return Statement{}, fmt.Errorf("alipay bill %s: %w", date, err)
	}
	var ans struct {
		Code            string `json:"code"`
		SubCode         string `json:"sub_code"`
		BillDownloadURL string `json:"bill_download_url"`
	}
	if err := json.Unmarshal([]byte(content), &ans); err != nil {
		return Statement{}, fmt.Errorf("alipay bill %s: the signed answer does not decode: %w", date, err)
	}
	switch {
	case ans.SubCode == "isp.bill_not_exist":
		return Statement{}, fmt.Errorf("alipay bill %s: %w (isp.bill_not_exist)", date, ErrNotReady)
	case ans.Code != "10000" || ans.BillDownloadURL == "":
		return Statement{}, fmt.Errorf("alipay bill %s: the signed answer says code %q without a bill_download_url", date, printable(ans.Code))
	}
	dl, err := downloadable(ans.BillDownloadURL)
	if err != nil {
		return Statement{}, fmt.Errorf("alipay bill %s: %w", date, err)
	}
	f, size, err := a.downloadZip(ctx, dl)
	if err != nil {
		return Statement{}, fmt.Errorf("alipay bill %s: %w", date, err)
	}
	remove := func() error { f.Close(); return os.Remove(f.Name()) }
	rc, _, err := bill.OpenAlipayZip(f, size)
	if err != nil {
		remove()
		return Statement{}, fmt.Errorf("alipay bill %s: %w", date, err)
	}
	return Statement{Reader: bill.NewAlipay(rc), Closer: closers{rc.Close, remove}}, nil
}

// downloadable returns the URL to fetch the zip from: https as given;
// Alipay's own hosts (*.alipay.com), which hand out http:// links, over
// https (the zip carries no checksum of its own: TLS is what keeps its
// rows from being changed on the way); plain http only to a loopback
// address (a local fake).
func downloadable(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", errors.New("bill_download_url does not parse")
	}
	host := u.Hostname()
	switch {
	case u.Scheme == "https":
		return raw, nil
	case u.Scheme == "http" && (host == "alipay.com" || strings.HasSuffix(host, ".alipay.com")):
		u.Scheme = "https"
		return u.String(), nil
	case u.Scheme == "http" && (host == "localhost" || net.ParseIP(host) != nil && net.ParseIP(host).IsLoopback()):
		return raw, nil
	}
	return "", fmt.Errorf("bill_download_url is %s://%s: want https", u.Scheme, printable(host))
}

// withoutURL is err without the URL a *url.Error quotes: a statement's
// download link carries a token, which has no place in a log or a run's
// message.
func withoutURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s: %w", ue.Op, ue.Err)
	}
	return err
}

// downloadZip fetches the zip to a temporary file (a zip is read from its
// end: it cannot be streamed) and returns it with its size.
func (a *Alipay) downloadZip(ctx context.Context, u string) (*os.File, int64, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.BillTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("the download: %w", err)
	}
	resp, err := a.download.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("the download: %w", withoutURL(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, 0, fmt.Errorf("the download: HTTP %d (the link is good for 30 s)", resp.StatusCode)
	}
	f, err := os.CreateTemp("", "notifyedge-bill-*.zip")
	if err != nil {
		return nil, 0, fmt.Errorf("the download: %w", err)
	}
	n, err := io.Copy(f, io.LimitReader(resp.Body, maxBillFile+1))
	err = withoutURL(err)
	if err == nil && n > maxBillFile {
		err = fmt.Errorf("larger than %d bytes", int64(maxBillFile))
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, 0, fmt.Errorf("the download: %w", err)
	}
	return f, n, nil
}
