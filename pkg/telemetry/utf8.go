package telemetry

import (
	"context"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// utf8Exporter makes every string of a span valid UTF-8 before the OTLP
// exporter sees it. OTLP carries them as proto strings, and one that is not
// UTF-8 (a socket path from a file name, a plugin's error text) fails the
// marshaling of the whole batch: every other span in it would be lost.
// Spans whose strings are all UTF-8 pass as they are.
type utf8Exporter struct{ sdktrace.SpanExporter }

func (e utf8Exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	out, copied := spans, false
	for i, s := range spans {
		if spanValid(s) {
			continue
		}
		if !copied {
			out, copied = append([]sdktrace.ReadOnlySpan(nil), spans...), true
		}
		out[i] = utf8Span{s}
	}
	return e.SpanExporter.ExportSpans(ctx, out)
}

func spanValid(s sdktrace.ReadOnlySpan) bool {
	if !utf8.ValidString(s.Name()) || !utf8.ValidString(s.Status().Description) || !attrsValid(s.Attributes()) {
		return false
	}
	for _, ev := range s.Events() {
		if !utf8.ValidString(ev.Name) || !attrsValid(ev.Attributes) {
			return false
		}
	}
	for _, l := range s.Links() {
		if !attrsValid(l.Attributes) {
			return false
		}
	}
	return true
}

func attrsValid(kvs []attribute.KeyValue) bool {
	for _, kv := range kvs {
		if !utf8.ValidString(string(kv.Key)) {
			return false
		}
		switch kv.Value.Type() {
		case attribute.STRING:
			if !utf8.ValidString(kv.Value.AsString()) {
				return false
			}
		case attribute.STRINGSLICE:
			for _, v := range kv.Value.AsStringSlice() {
				if !utf8.ValidString(v) {
					return false
				}
			}
		}
	}
	return true
}

// utf8Span is a span with its strings made valid UTF-8 (each sequence that
// is not replaced by U+FFFD).
type utf8Span struct{ sdktrace.ReadOnlySpan }

func (s utf8Span) Name() string { return valid(s.ReadOnlySpan.Name()) }

func (s utf8Span) Status() sdktrace.Status {
	st := s.ReadOnlySpan.Status()
	st.Description = valid(st.Description)
	return st
}

func (s utf8Span) Attributes() []attribute.KeyValue { return validAttrs(s.ReadOnlySpan.Attributes()) }

func (s utf8Span) Events() []sdktrace.Event {
	evs := s.ReadOnlySpan.Events()
	out := make([]sdktrace.Event, len(evs))
	for i, ev := range evs {
		ev.Name, ev.Attributes = valid(ev.Name), validAttrs(ev.Attributes)
		out[i] = ev
	}
	return out
}

func (s utf8Span) Links() []sdktrace.Link {
	ls := s.ReadOnlySpan.Links()
	out := make([]sdktrace.Link, len(ls))
	for i, l := range ls {
		l.Attributes = validAttrs(l.Attributes)
		out[i] = l
	}
	return out
}

func validAttrs(kvs []attribute.KeyValue) []attribute.KeyValue {
	if attrsValid(kvs) {
		return kvs
	}
	out := make([]attribute.KeyValue, len(kvs))
	for i, kv := range kvs {
		kv.Key = attribute.Key(valid(string(kv.Key)))
		switch kv.Value.Type() {
		case attribute.STRING:
			kv.Value = attribute.StringValue(valid(kv.Value.AsString()))
		case attribute.STRINGSLICE:
			vs := kv.Value.AsStringSlice()
			for j := range vs {
				vs[j] = valid(vs[j])
			}
			kv.Value = attribute.StringSliceValue(vs)
		}
		out[i] = kv
	}
	return out
}

// valid returns s with each sequence that is not UTF-8 replaced by U+FFFD.
func valid(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
