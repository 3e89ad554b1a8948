package testutil

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestStaleSocket: the file is a socket, and it refuses connections.
func TestStaleSocket(t *testing.T) {
	path := filepath.Join(TempDir(t), "stale.sock")
	StaleSocket(t, path)
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("stale socket: %v, %v", fi, err)
	}
	if _, err := net.Dial("unix", path); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial of a stale socket: %v, want ECONNREFUSED", err)
	}
}

func TestFindMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total", Help: "c"}, []string{"a", "b"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g", Help: "g"})
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Help: "h"})
	s := prometheus.NewSummary(prometheus.SummaryOpts{Name: "s", Help: "s"})
	reg.MustRegister(c, g, h, s)
	c.WithLabelValues("x", "1").Add(2)
	c.WithLabelValues("y", "1").Add(3)
	g.Set(7)
	h.Observe(1)
	h.Observe(2)
	s.Observe(1)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
		ok     bool
	}{
		{"c_total", map[string]string{"a": "y"}, 3, true},
		{"c_total", map[string]string{"a": "x", "b": "1"}, 2, true},
		{"c_total", map[string]string{"a": "z"}, 0, false},
		{"c_total", map[string]string{"other": "v"}, 2, true}, // a label a series lacks does not exclude it
		{"g", nil, 7, true},
		{"h", nil, 2, true}, // a histogram's sample count
		{"s", nil, 0, false},
		{"missing", nil, 0, false},
	} {
		got, ok := MetricValue(FindMetric(families, tc.name, tc.labels))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s %v = %v, %v; want %v, %v", tc.name, tc.labels, got, ok, tc.want, tc.ok)
		}
	}
}
