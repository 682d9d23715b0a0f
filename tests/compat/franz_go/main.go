// Strand compatibility program for franz-go (kgo + kadm).
//
// Usage: franz-compat HOST:PORT
//
// A small real application of the client: kadm create topic, keyed produce
// with headers (acks=all), group consume + commit, committed offsets read back
// with kadm, idempotent produce, transactions with a read_committed consume,
// and a consume-transform-produce through GroupTransactSession. One RESULT
// line per capability; exit 1 if any capability failed.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

const (
	partitions = 3
	nRecords   = 30
)

var (
	version = "unknown"
	failed  = false
)

func result(capability, status, detail string) {
	detail = strings.Join(strings.Fields(detail), " ")
	if len(detail) > 300 {
		detail = detail[:300]
	}
	if status == "fail" {
		failed = true
	}
	fmt.Printf("RESULT client=franz-go version=%s capability=%s status=%s detail=%s\n", version, capability, status, detail)
}

type rec struct {
	key, value string
	headers    []kgo.RecordHeader
}

func expected(tag string) []rec {
	out := make([]rec, nRecords)
	for i := range out {
		out[i] = rec{
			key:   fmt.Sprintf("key-%d", i%10),
			value: fmt.Sprintf("%s-value-%d", tag, i),
			headers: []kgo.RecordHeader{
				{Key: "seq", Value: []byte(fmt.Sprint(i))},
				{Key: "client", Value: []byte("franz-go")},
			},
		}
	}
	return out
}

func toRecords(topic string, rs []rec) []*kgo.Record {
	out := make([]*kgo.Record, len(rs))
	for i, r := range rs {
		out[i] = &kgo.Record{Topic: topic, Key: []byte(r.key), Value: []byte(r.value), Headers: r.headers}
	}
	return out
}

// check verifies count, keys, values, headers and per-partition order.
func check(got []*kgo.Record, want []rec) string {
	if len(got) != len(want) {
		return fmt.Sprintf("expected %d records, got %d", len(want), len(got))
	}
	byValue := map[string]int{}
	for i, r := range want {
		byValue[r.value] = i
	}
	type pos struct {
		seq    int
		offset int64
	}
	last := map[int32]pos{}
	for _, g := range got {
		i, ok := byValue[string(g.Value)]
		if !ok {
			return fmt.Sprintf("unexpected value %q", g.Value)
		}
		delete(byValue, string(g.Value))
		w := want[i]
		if string(g.Key) != w.key {
			return fmt.Sprintf("key %q != %q for %q", g.Key, w.key, g.Value)
		}
		if len(g.Headers) != len(w.headers) {
			return fmt.Sprintf("%d headers for %q, want %d", len(g.Headers), g.Value, len(w.headers))
		}
		for j, h := range g.Headers {
			if h.Key != w.headers[j].Key || !bytes.Equal(h.Value, w.headers[j].Value) {
				return fmt.Sprintf("header %s=%s for %q, want %s=%s", h.Key, h.Value, g.Value, w.headers[j].Key, w.headers[j].Value)
			}
		}
		if p, ok := last[g.Partition]; ok && (i <= p.seq || g.Offset <= p.offset) {
			return fmt.Sprintf("partition %d out of order at offset %d", g.Partition, g.Offset)
		}
		last[g.Partition] = pos{i, g.Offset}
	}
	return ""
}

// consume polls until n records whose value starts with prefix arrived or the timeout passed.
func consume(cl interface {
	PollFetches(context.Context) kgo.Fetches
}, n int, prefix string, timeout time.Duration) ([]*kgo.Record, error) {
	return consumeTracking(cl, n, prefix, timeout, nil)
}

// consumeTracking is consume that also notes, in last, the highest offset of
// every record polled per partition, whatever its prefix: what a group
// transact session commits is the offset after the last record it returned.
func consumeTracking(cl interface {
	PollFetches(context.Context) kgo.Fetches
}, n int, prefix string, timeout time.Duration, last map[int32]int64) ([]*kgo.Record, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n && ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				ferr = fmt.Errorf("%s/%d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return out, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			if last != nil && r.Offset > last[r.Partition] {
				last[r.Partition] = r.Offset
			}
			if strings.HasPrefix(string(r.Value), prefix) {
				out = append(out, r)
			}
		})
	}
	return out, nil
}

// lacksInitProducerID: the broker's ApiVersions (asked through kadm) does not
// list InitProducerId (key 22), so the idempotent producer cannot work; a
// failure of that path is then a named gap, not a bug.
var lacksInitProducerID = false

// brokerAPIs: the API keys every broker advertises in ApiVersions (through
// kadm); nil when they could not be asked.
var brokerAPIs map[int16]bool

// Transactional APIs each capability needs, with their names.
var (
	apiNames = map[int16]string{24: "AddPartitionsToTxn", 25: "AddOffsetsToTxn", 26: "EndTxn", 28: "TxnOffsetCommit"}
	txnAPIs  = []int16{24, 26}
	ctpAPIs  = []int16{24, 25, 26, 28}
)

// txnFailure reports a failed transactional path: a gap exactly when the
// broker does not advertise an API the capability needs, else a failure.
func txnFailure(capability string, needed []int16, what string, err error) {
	if brokerAPIs == nil {
		result(capability, "fail", what+": "+err.Error()+" (broker ApiVersions unknown)")
		return
	}
	var lacking []string
	for _, k := range needed {
		if !brokerAPIs[k] {
			lacking = append(lacking, fmt.Sprintf("%s(%d)", apiNames[k], k))
		}
	}
	if len(lacking) > 0 {
		result(capability, "gap", "broker lacks "+strings.Join(lacking, ", ")+" (transactions, not in ApiVersions): "+what+": "+err.Error())
	} else {
		result(capability, "fail", what+": "+err.Error())
	}
}

// unsupported: franz-go's errors when the broker does not serve an API.
func unsupported(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	return lacksInitProducerID || errors.Is(err, kerr.UnsupportedVersion) || strings.Contains(s, "broker is too old") ||
		strings.Contains(s, "request key is unknown")
}

func endOffsets(adm *kadm.Client, topic string) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	lo, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	var lerr error
	lo.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			lerr = o.Err
		}
		out[o.Partition] = o.Offset
	})
	return out, lerr
}

func committedOffsets(adm *kadm.Client, group, topic string) (map[int32]int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	or, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		return nil, err
	}
	if err := or.Error(); err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for p, o := range or[topic] {
		out[p] = o.At
	}
	return out, nil
}

// ctpOffsetsCheck: Kafka commits, with a transaction, the offset of the next
// record to consume. franz-go's GroupTransactSession commits the offset after
// the last record it returned from a poll; that may be one below the log end
// offset when the log ends with a transaction marker (control records are
// never returned), so the expectation is "last polled offset + 1" per
// partition, never beyond the log end.
func ctpOffsetsCheck(committed, polled, ends map[int32]int64) string {
	if len(committed) != len(ends) {
		return fmt.Sprintf("offsets committed with the transaction %v: not one per partition (end offsets %v)", committed, ends)
	}
	for p, end := range ends {
		last, ok := polled[p]
		c, cok := committed[p]
		if !ok || !cok || c != last+1 || c > end {
			return fmt.Sprintf("offsets committed with the transaction %v != last polled offsets + 1 %v (end offsets %v)", committed, plusOne(polled), ends)
		}
	}
	return ""
}

func ends0(adm *kadm.Client, topic string) map[int32]int64 {
	e, _ := endOffsets(adm, topic)
	return e
}

func plusOne(m map[int32]int64) map[int32]int64 {
	out := map[int32]int64{}
	for k, v := range m {
		out[k] = v + 1
	}
	return out
}

func sameOffsets(a, b map[int32]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: franz-compat HOST:PORT")
		os.Exit(2)
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/twmb/franz-go" {
				version = d.Version
			}
		}
	}
	bootstrap := os.Args[1]
	b := make([]byte, 5)
	rand.Read(b)
	run := hex.EncodeToString(b)
	topic := "compat-franz-" + run
	group := "compat-franz-group-" + run
	seeds := kgo.SeedBrokers(bootstrap)
	ctx := context.Background()

	admCl, err := kgo.NewClient(seeds)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer admCl.Close()
	adm := kadm.NewClient(admCl)

	func() {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		vs, err := adm.ApiVersions(c)
		if err != nil {
			return
		}
		apis := map[int16]bool{}
		first, answered := true, true
		vs.Each(func(v kadm.BrokerApiVersions) {
			if v.Err != nil {
				answered = false
				return
			}
			if _, ok := v.KeyMaxVersion(22); !ok {
				lacksInitProducerID = true
			}
			for k := range apiNames {
				_, has := v.KeyMaxVersion(k)
				apis[k] = has && (first || apis[k])
			}
			first = false
		})
		if answered && !first {
			brokerAPIs = apis
		}
	}()

	// admin
	func() {
		c, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		resp, err := adm.CreateTopic(c, partitions, 1, nil, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil {
			result("admin", "fail", "CreateTopics: "+err.Error())
			return
		}
		td, err := adm.ListTopics(c, topic)
		if err != nil {
			result("admin", "fail", "Metadata: "+err.Error())
			return
		}
		d := td[topic]
		if d.Err != nil || len(d.Partitions) != partitions || d.ID == (kadm.TopicID{}) || d.ID != resp.ID {
			result("admin", "fail", fmt.Sprintf("after create: %d partitions, err %v, id %s vs created %s", len(d.Partitions), d.Err, d.ID, resp.ID))
			return
		}
		result("admin", "pass", fmt.Sprintf("kadm CreateTopic %d partitions, ListTopics agrees (topic id %s)", partitions, d.ID))
	}()

	// produce
	records := expected("plain")
	produced := func() bool {
		cl, err := kgo.NewClient(seeds, kgo.RequiredAcks(kgo.AllISRAcks()), kgo.DisableIdempotentWrite(),
			kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
		if err != nil {
			result("produce", "fail", err.Error())
			return false
		}
		defer cl.Close()
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := cl.ProduceSync(c, toRecords(topic, records)...).FirstErr(); err != nil {
			result("produce", "fail", "ProduceSync: "+err.Error())
			return false
		}
		result("produce", "pass", fmt.Sprintf("%d keyed records with headers, acks=all", nRecords))
		return true
	}()

	// consume-group + committed-offsets
	func() {
		if !produced {
			result("consume-group", "fail", "nothing produced")
			result("committed-offsets", "fail", "nothing produced")
			return
		}
		cl, err := kgo.NewClient(seeds, kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
		if err != nil {
			result("consume-group", "fail", err.Error())
			result("committed-offsets", "fail", "not reached")
			return
		}
		got, err := consume(cl, nRecords, "plain-", 30*time.Second)
		msg := check(got, records)
		if err != nil {
			msg = "poll: " + err.Error()
		}
		if msg == "" {
			c, cancel := context.WithTimeout(ctx, 15*time.Second)
			if err := cl.CommitUncommittedOffsets(c); err != nil {
				msg = "commit: " + err.Error()
			}
			cancel()
		}
		cl.Close() // leaves the group
		if msg != "" {
			result("consume-group", "fail", msg)
			result("committed-offsets", "fail", "not reached: consume failed")
			return
		}
		result("consume-group", "pass", fmt.Sprintf("subscribe, %d records checked, CommitUncommittedOffsets", nRecords))
		committed, err := committedOffsets(adm, group, topic)
		if err != nil {
			result("committed-offsets", "fail", "kadm FetchOffsets: "+err.Error())
			return
		}
		ends, err := endOffsets(adm, topic)
		if err != nil {
			result("committed-offsets", "fail", "kadm ListEndOffsets: "+err.Error())
			return
		}
		if !sameOffsets(committed, ends) {
			result("committed-offsets", "fail", fmt.Sprintf("committed %v != end offsets %v", committed, ends))
			return
		}
		result("committed-offsets", "pass", fmt.Sprintf("kadm FetchOffsets returns the end offsets %v", ends))
	}()

	// idempotent: franz-go's default producer is idempotent; it falls back
	// silently to a producer without id when the broker lacks InitProducerId.
	func() {
		cl, err := kgo.NewClient(seeds, kgo.RequiredAcks(kgo.AllISRAcks()))
		if err != nil {
			result("idempotent", "fail", err.Error())
			return
		}
		defer cl.Close()
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		idemTopic := topic
		want := expected("idem")
		rs := toRecords(idemTopic, want)
		if err := cl.ProduceSync(c, rs...).FirstErr(); err != nil {
			if unsupported(err) {
				result("idempotent", "gap", "broker lacks InitProducerId (idempotent producer): "+err.Error())
			} else {
				result("idempotent", "fail", "idempotent produce: "+err.Error())
			}
			return
		}
		if rs[0].ProducerID < 0 {
			_, _, perr := cl.ProducerID(c)
			result("idempotent", "gap", fmt.Sprintf("broker lacks InitProducerId (idempotent producer): franz-go fell back to producing without a producer id (%v)", perr))
			return
		}
		rc, _ := kgo.NewClient(seeds, kgo.ConsumeTopics(idemTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		defer rc.Close()
		got, err := consume(rc, nRecords, "idem-", 20*time.Second)
		msg := check(got, want)
		if err != nil {
			msg = err.Error()
		}
		if msg != "" {
			result("idempotent", "fail", msg)
			return
		}
		result("idempotent", "pass", fmt.Sprintf("producer id %d, %d records checked", rs[0].ProducerID, nRecords))
	}()

	// transactions: one aborted and one committed transaction, read_committed consume
	func() {
		txTopic := topic
		cl, err := kgo.NewClient(seeds, kgo.TransactionalID("compat-franz-tx-"+run))
		if err != nil {
			result("transactions", "fail", err.Error())
			return
		}
		defer cl.Close()
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		fail := func(what string, err error) { txnFailure("transactions", txnAPIs, what, err) }
		for _, step := range []struct {
			tag    string
			commit kgo.TransactionEndTry
		}{{"aborted", kgo.TryAbort}, {"txn", kgo.TryCommit}} {
			if err := cl.BeginTransaction(); err != nil {
				fail("BeginTransaction", err)
				return
			}
			if err := cl.ProduceSync(c, toRecords(txTopic, expected(step.tag))...).FirstErr(); err != nil {
				fail("transactional produce", err)
				return
			}
			if err := cl.EndTransaction(c, step.commit); err != nil {
				fail("EndTransaction", err)
				return
			}
		}
		rc, _ := kgo.NewClient(seeds, kgo.ConsumeTopics(txTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		defer rc.Close()
		aborted, _ := consume(rc, 1<<30, "aborted-", 8*time.Second)
		if len(aborted) > 0 {
			result("transactions", "fail", "read_committed consumer saw aborted records")
			return
		}
		rc2, _ := kgo.NewClient(seeds, kgo.ConsumeTopics(txTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		defer rc2.Close()
		got, err := consume(rc2, nRecords, "txn-", 20*time.Second)
		msg := check(got, expected("txn"))
		if err != nil {
			msg = err.Error()
		}
		if msg != "" {
			result("transactions", "fail", msg)
			return
		}
		result("transactions", "pass", fmt.Sprintf("abort + commit, read_committed sees only the %d committed records", nRecords))
	}()

	// consume-transform-produce with GroupTransactSession
	func() {
		outTopic := topic + "-out"
		ctpGroup := group + "-ctp"
		fail := func(what string, err error) { txnFailure("consume-transform-produce", ctpAPIs, what, err) }
		c, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if _, err := adm.CreateTopic(c, partitions, 1, nil, outTopic); err != nil {
			fail("CreateTopics", err)
			return
		}
		s, err := kgo.NewGroupTransactSession(seeds, kgo.TransactionalID("compat-franz-ctp-"+run),
			kgo.ConsumerGroup(ctpGroup), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		if err != nil {
			fail("NewGroupTransactSession", err)
			return
		}
		defer s.Close()
		polled := map[int32]int64{}
		in, err := consumeTracking(s, nRecords, "plain-", 30*time.Second, polled)
		if err != nil {
			fail("poll", err)
			return
		}
		if err := s.Begin(); err != nil {
			fail("Begin", err)
			return
		}
		var outs []*kgo.Record
		for _, r := range in {
			outs = append(outs, &kgo.Record{Topic: outTopic, Key: r.Key, Value: bytes.ToUpper(r.Value), Headers: r.Headers})
		}
		if err := s.ProduceSync(c, outs...).FirstErr(); err != nil {
			fail("transactional produce", err)
			return
		}
		committed, err := s.End(c, kgo.TryCommit)
		if err != nil {
			fail("End (AddOffsetsToTxn/TxnOffsetCommit/EndTxn)", err)
			return
		}
		if !committed {
			result("consume-transform-produce", "fail", "transaction was aborted by the session")
			return
		}
		want := expected("plain")
		for i := range want {
			want[i].value = strings.ToUpper(want[i].value)
		}
		rc, _ := kgo.NewClient(seeds, kgo.ConsumeTopics(outTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()))
		defer rc.Close()
		got, err := consume(rc, nRecords, "PLAIN-", 20*time.Second)
		msg := check(got, want)
		if err != nil {
			msg = err.Error()
		}
		var co map[int32]int64
		if msg == "" {
			var err1 error
			co, err1 = committedOffsets(adm, ctpGroup, topic)
			ends, err2 := endOffsets(adm, topic)
			if err := errors.Join(err1, err2); err != nil {
				msg = err.Error()
			} else {
				msg = ctpOffsetsCheck(co, polled, ends)
			}
		}
		if msg == "" {
			// a new member of the group resumes after the committed offsets:
			// no record it already transformed is read again
			rc2, _ := kgo.NewClient(seeds, kgo.ConsumerGroup(ctpGroup), kgo.ConsumeTopics(topic),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
			again, _ := consume(rc2, 1<<30, "", 8*time.Second)
			rc2.Close()
			for _, r := range again {
				if r.Offset <= polled[r.Partition] {
					msg = fmt.Sprintf("resuming group %s re-read partition %d offset %d (committed %v)", ctpGroup, r.Partition, r.Offset, co)
					break
				}
			}
		}
		if msg != "" {
			result("consume-transform-produce", "fail", msg)
			return
		}
		result("consume-transform-produce", "pass", fmt.Sprintf("%d records transformed in one transaction; committed offsets %v = last polled + 1 (end offsets %v); a resumed member reads nothing again", nRecords, co, ends0(adm, topic)))
	}()

	if failed {
		os.Exit(1)
	}
}
