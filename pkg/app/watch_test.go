package app

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/pkg/stream"
)

// The Watch bounds by caller are flags with variables, their defaults
// stream's, shown in the usage; the hubs get room for the total.
func TestWatchFlags(t *testing.T) {
	parseWatch := func(args ...string) (Config, error) {
		cfg := Config{}
		fs := NewFlags("watcher")
		watchFlags(fs, &cfg)
		if err := fs.Parse(args); err != nil {
			return cfg, err
		}
		return cfg, cfg.validateWatch()
	}
	cfg, err := parseWatch()
	if err != nil || cfg.Watch != stream.DefaultSlotLimits {
		t.Fatalf("defaults: %+v, %v; want %+v", cfg.Watch, err, stream.DefaultSlotLimits)
	}
	t.Setenv("NODEPLUG_WATCHER_WATCH_STREAMS_PER_CALLER", "3")
	cfg, err = parseWatch("--watch-streams", "100", "--watch-streams-reserved", "20")
	if err != nil || cfg.Watch != (stream.SlotLimits{Total: 100, PerCaller: 3, Reserved: 20}) {
		t.Fatalf("flags and variable: %+v, %v", cfg.Watch, err)
	}
	if got := cfg.WatchLimits(); got.Subscribers != 100 {
		t.Errorf("the hubs' limits %+v, want room for 100 subscribers", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--watch-streams", "0"}, "--watch-streams 0: must be at least 1"},
		{[]string{"--watch-streams-per-caller", "-1"}, "--watch-streams-per-caller -1: must be at least 1"},
		{[]string{"--watch-streams-reserved", "0"}, "--watch-streams-reserved 0: must be at least 1"},
		{[]string{"--watch-streams", "16", "--watch-streams-reserved", "16"}, "--watch-streams-reserved 16 must be less than --watch-streams 16"},
	} {
		if _, err := parseWatch(tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}

	var usage bytes.Buffer
	fs := NewFlags("devicemanager")
	watchFlags(fs, &Config{})
	fs.SetOutput(&usage)
	fs.PrintDefaults()
	for _, want := range []string{"--watch-streams (env NODEPLUG_DEVICEMANAGER_WATCH_STREAMS)", `(default "64")`,
		"--watch-streams-per-caller", `(default "8")`, "--watch-streams-reserved", `(default "16")`} {
		if !strings.Contains(usage.String(), want) {
			t.Errorf("usage does not show %q:\n%s", want, usage.String())
		}
	}
}
