package kubeletreg

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// errorsOnly is the process's logger: klog at -v=0 with even its V(0)
// messages left out. Errors are written to w, one line each; nothing else
// is.
func errorsOnly(w io.Writer) logr.Logger {
	return logr.New(&errorSink{out: &syncWriter{w: w}})
}

// syncWriter writes whole lines from any goroutine.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

// errorSink is a logr.LogSink that writes only errors.
type errorSink struct {
	out    *syncWriter
	name   string
	values []any
}

func (*errorSink) Init(logr.RuntimeInfo)    {}
func (*errorSink) Enabled(int) bool         { return false }
func (*errorSink) Info(int, string, ...any) {}
func (s *errorSink) WithName(name string) logr.LogSink {
	c := *s
	c.name = strings.TrimPrefix(s.name+"/"+name, "/")
	return &c
}

func (s *errorSink) WithValues(kv ...any) logr.LogSink {
	c := *s
	c.values = append(append([]any(nil), s.values...), kv...)
	return &c
}

func (s *errorSink) Error(err error, msg string, kv ...any) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s E %s", time.Now().Format("15:04:05.000000"), msg)
	if s.name != "" {
		fmt.Fprintf(&b, " logger=%q", s.name)
	}
	if err != nil {
		fmt.Fprintf(&b, " err=%q", err.Error())
	}
	all := append(append([]any(nil), s.values...), kv...)
	for i := 0; i+1 < len(all); i += 2 {
		fmt.Fprintf(&b, " %v=%q", all[i], fmt.Sprint(all[i+1]))
	}
	b.WriteByte('\n')
	s.out.mu.Lock()
	defer s.out.mu.Unlock()
	_, _ = io.WriteString(s.out.w, b.String())
}
