package querytest

import (
	"bytes"
	"compress/gzip"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Bill is a day's statement as a fake channel holds it.
type Bill struct {
	// Status is why there is no file: "" (ready), WeChat's
	// NO_STATEMENT_EXIST or STATEMENT_CREATING (400 answers), Alipay's
	// isp.bill_not_exist (40004).
	Status string
	// File is what the channel serves: WeChat's CSV as it is before the
	// fake gzips it, Alipay's zip.
	File []byte
	// Hash, when set, is WeChat's hash_value instead of the file's SHA-1:
	// a file that fails its check.
	Hash string
	// Corrupt flips a byte of the CRC-32 in WeChat's gzip trailer: a file
	// that decompresses to the end and then fails its checksum.
	Corrupt bool

	gz   []byte
	sum  string
	sent time.Time // when Alipay's download URL was handed out
}

// SetBill makes date's (YYYY-MM-DD) statement b.
func (f *fake) SetBill(date string, b Bill) {
	if b.Status == "" {
		var z bytes.Buffer
		w := gzip.NewWriter(&z)
		w.Write(b.File)
		w.Close()
		sum := sha1.Sum(b.File)
		b.gz, b.sum = z.Bytes(), hex.EncodeToString(sum[:])
		if b.Corrupt {
			b.gz[len(b.gz)-6] ^= 0xff
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bills == nil {
		f.bills = map[string]Bill{}
	}
	f.bills[date] = b
}

// bill returns date's statement.
func (f *fake) bill(date string) (Bill, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.bills[date]
	return b, ok
}

// BillAsks returns how many times date's statement was asked for (the
// download URL, not the file).
func (f *fake) BillAsks(date string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.billAsks[date]
}

func (f *fake) askedBill(date string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.billAsks == nil {
		f.billAsks = map[string]int{}
	}
	f.billAsks[date]++
}

// The paths of WeChat Pay's trade bill and of its file download.
const (
	TradeBillPath = "/v3/bill/tradebill"
	BillFilePath  = "/v3/billdownload/file"
)

// serveBill answers GET /v3/bill/tradebill (signed JSON with the file's
// SHA-1 and download_url) and GET /v3/billdownload/file (the gzip, not
// signed); both requests must be signed by the merchant.
func (f *WeChatFake) serveBill(w http.ResponseWriter, r *http.Request) {
	if _, reason := f.authenticate(r); reason != "" {
		f.answer(w, http.StatusUnauthorized, map[string]string{"code": "SIGN_ERROR", "message": reason}, false)
		return
	}
	q := r.URL.Query()
	if r.URL.Path == BillFilePath {
		b, ok := f.bill(q.Get("token"))
		if !ok || b.Status != "" {
			f.answer(w, http.StatusNotFound, map[string]string{"code": "RESOURCE_NOT_EXISTS", "message": "文件不存在"}, false)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(b.gz)
		return
	}
	date := q.Get("bill_date")
	if q.Get("bill_type") != "ALL" || q.Get("tar_type") != "GZIP" || date == "" {
		f.answer(w, http.StatusBadRequest, map[string]string{"code": "PARAM_ERROR", "message": "bill_type=ALL and tar_type=GZIP expected"}, true)
		return
	}
	f.askedBill(date)
	b, ok := f.bill(date)
	switch {
	case !ok:
		f.answer(w, http.StatusBadRequest, map[string]string{"code": "STATEMENT_CREATING", "message": "账单生成中"}, true)
		return
	case b.Status != "":
		msg := map[string]string{"NO_STATEMENT_EXIST": "请求的账单文件不存在", "STATEMENT_CREATING": "账单生成中"}[b.Status]
		f.answer(w, http.StatusBadRequest, map[string]string{"code": b.Status, "message": msg}, true)
		return
	}
	hash := b.sum
	if b.Hash != "" {
		hash = b.Hash
	}
	f.answer(w, http.StatusOK, map[string]string{"hash_type": "SHA1", "hash_value": hash,
		"download_url": "https://api.mch.weixin.qq.com" + BillFilePath + "?token=" + url.QueryEscape(date) + "&tartype=gzip"}, true)
}

// BillMethod is Alipay's method for a statement's download URL.
const BillMethod = "alipay.data.dataservice.bill.downloadurl.query"

// AlipayBillPath is where the fake serves the zips it hands out URLs for.
const AlipayBillPath = "/downloadBillFile.resource"

// alipayURLTTL is how long Alipay's download URL is good for.
const alipayURLTTL = 30 * time.Second

// billURL answers the download URL query: the URL of the day's zip, or
// 40004 isp.bill_not_exist (signed, as Alipay signs it).
func (f *AlipayFake) billURL(w http.ResponseWriter, bizContent string) {
	const name = "alipay_data_dataservice_bill_downloadurl_query_response"
	var biz struct {
		BillType string `json:"bill_type"`
		BillDate string `json:"bill_date"`
	}
	if json.Unmarshal([]byte(bizContent), &biz) != nil || biz.BillType != "trade" || biz.BillDate == "" {
		f.answerAs(w, name, invalid("isv.invalid-parameter", "bill_type=trade and bill_date expected"), true)
		return
	}
	f.askedBill(biz.BillDate)
	b, ok := f.bill(biz.BillDate)
	if !ok || b.Status != "" {
		f.answerAs(w, name, alipayAnswer{Code: "40004", Msg: "Business Failed", SubCode: "isp.bill_not_exist", SubMsg: "账单不存在"}, true)
		return
	}
	b.sent = time.Now()
	f.mu.Lock()
	f.bills[biz.BillDate] = b
	f.mu.Unlock()
	f.answerAs(w, name, struct {
		Code            string `json:"code"`
		Msg             string `json:"msg"`
		BillDownloadURL string `json:"bill_download_url"`
	}{"10000", "Success", f.URL() + AlipayBillPath + "?downloadFileName=" + url.QueryEscape(biz.BillDate) +
		"&timestamp=" + strconv.FormatInt(b.sent.UnixMilli(), 10)}, true)
}

// serveBillFile serves a zip whose URL was handed out less than 30 s ago.
func (f *AlipayFake) serveBillFile(w http.ResponseWriter, r *http.Request) {
	b, ok := f.bill(r.URL.Query().Get("downloadFileName"))
	if !ok || b.Status != "" || b.sent.IsZero() || time.Since(b.sent) > alipayURLTTL {
		http.Error(w, "the link has expired", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/oct-stream")
	w.Write(b.File)
}
