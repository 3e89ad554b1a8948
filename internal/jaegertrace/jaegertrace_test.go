package jaegertrace

import (
	"encoding/json"
	"reflect"
	"testing"
)

func span(id string, start int64, refs ...Reference) Span {
	return Span{TraceID: "t", SpanID: id, OperationName: "op-" + id, StartTime: start, Duration: 1, References: refs}
}

func childOf(id string) Reference { return Reference{RefType: "CHILD_OF", TraceID: "t", SpanID: id} }

// TestWaterfall: roots by start, children below their parent depth first and
// by start, a parent outside the trace makes a root, a reference cycle is
// shown at the top level, and every span appears exactly once.
func TestWaterfall(t *testing.T) {
	tr := Trace{TraceID: "t", Spans: []Span{
		span("c2", 30, childOf("root")),
		span("root", 10),
		span("c1", 20, childOf("root")),
		span("g1", 25, childOf("c1")),
		span("link", 40, Reference{RefType: "FOLLOWS_FROM", TraceID: "t", SpanID: "c2"}),
		span("orphan", 5, childOf("not-here")),
		span("x", 50, childOf("y")),
		span("y", 60, childOf("x")),
		span("same-a", 70), span("same-b", 70),
	}}
	var got []string
	var depths []int
	for _, r := range tr.Waterfall() {
		got = append(got, tr.Spans[r.Index].SpanID)
		depths = append(depths, r.Depth)
	}
	want := []string{"orphan", "root", "c1", "g1", "c2", "link", "same-a", "same-b", "x", "y"}
	wantDepths := []int{0, 0, 1, 2, 1, 2, 0, 0, 0, 1}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(depths, wantDepths) {
		t.Fatalf("waterfall %v depths %v, want %v depths %v", got, depths, want, wantDepths)
	}
	if rows := (&Trace{}).Waterfall(); len(rows) != 0 {
		t.Fatalf("an empty trace has rows: %v", rows)
	}
}

// TestJaegerJSON: the model reads Jaeger's answer, and Service, Parent and
// Failed read it as the waterfall needs.
func TestJaegerJSON(t *testing.T) {
	const body = `{"data":[{"traceID":"00ab","spans":[
	  {"traceID":"00ab","spanID":"1","operationName":"a","references":[],"startTime":100,"duration":5,"processID":"p1",
	   "tags":[{"key":"otel.status_code","type":"string","value":"ERROR"}]},
	  {"traceID":"00ab","spanID":"2","operationName":"b","references":[{"refType":"CHILD_OF","traceID":"00ab","spanID":"1"}],
	   "startTime":101,"duration":2,"processID":"p9","tags":[{"key":"error","type":"bool","value":false}]}],
	  "processes":{"p1":{"serviceName":"nodeplug-watcher","tags":[]}}}]}`
	var r Response
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatal(err)
	}
	tr := &r.Data[0]
	a, b := &tr.Spans[0], &tr.Spans[1]
	if tr.Service(a) != "nodeplug-watcher" || tr.Service(b) != "?" {
		t.Errorf("services %q %q", tr.Service(a), tr.Service(b))
	}
	if a.Parent() != "" || b.Parent() != "1" {
		t.Errorf("parents %q %q", a.Parent(), b.Parent())
	}
	if !a.Failed() || b.Failed() {
		t.Errorf("failed %v %v", a.Failed(), b.Failed())
	}
	if got := NormalizeID("AB"); got != "000000000000000000000000000000ab" {
		t.Errorf("NormalizeID = %q", got)
	}
	if NormalizeID("xyz") != "" || NormalizeID("") != "" {
		t.Error("NormalizeID took a malformed ID")
	}
}

func TestFormatMicros(t *testing.T) {
	for us, want := range map[int64]string{0: "0µs", 999: "999µs", 1000: "1.00ms", 1250: "1.25ms", 2_500_000: "2.500s"} {
		if got := FormatMicros(us); got != want {
			t.Errorf("FormatMicros(%d) = %q, want %q", us, got, want)
		}
	}
}
