package app

import (
	"fmt"

	"github.com/nodeplug/nodeplug/pkg/stream"
)

// watchFlags defines the bounds of the Watch streams by caller on fs
// (DESIGN "Bounds"): --watch-streams, --watch-streams-per-caller and
// --watch-streams-reserved, each for every Watch RPC of the service.
func watchFlags(fs *Flags, cfg *Config) {
	d := stream.DefaultSlotLimits
	fs.IntVar(&cfg.Watch.Total, "watch-streams", d.Total,
		"Watch streams one Watch RPC serves at once, in total")
	fs.IntVar(&cfg.Watch.PerCaller, "watch-streams-per-caller", d.PerCaller,
		"Watch streams one caller (a uid on the API socket, a client certificate over TCP) may hold on one Watch RPC; "+
			"root, the service's own uid and nodeplug:internal certificates are bounded only in total")
	fs.IntVar(&cfg.Watch.Reserved, "watch-streams-reserved", d.Reserved,
		"of --watch-streams, the streams kept for root, the service's own uid and nodeplug:internal certificates "+
			"(the services themselves): readers and operators together hold the others only")
}

// validateWatch checks the Watch bounds as the flags give them (each at
// least 1, fewer kept than in total); a Config built in code may leave them
// zero for the defaults.
func (c *Config) validateWatch() error {
	w := c.Watch
	for _, f := range []struct {
		name string
		v    int
	}{{"watch-streams", w.Total}, {"watch-streams-per-caller", w.PerCaller}, {"watch-streams-reserved", w.Reserved}} {
		if f.v < 1 {
			return fmt.Errorf("--%s %d: must be at least 1", f.name, f.v)
		}
	}
	if w.Reserved >= w.Total {
		return fmt.Errorf("--watch-streams-reserved %d must be less than --watch-streams %d: readers could not watch at all", w.Reserved, w.Total)
	}
	return nil
}

// WatchLimits returns the bounds of a Watch RPC's hub for this
// configuration: the defaults, with room for --watch-streams subscribers,
// so that the hub never refuses a stream the per-caller bounds admitted.
func (c *Config) WatchLimits() stream.Limits {
	return stream.Limits{Subscribers: c.Watch.WithDefaults().Total}
}
