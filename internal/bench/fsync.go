package bench

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/pkg/app"
)

// fsyncFloor measures the least that making one change durable can cost
// on the checkpoint's filesystem: appends of a small record to a file in
// the device-plugins directory, each followed by fdatasync, at least n of
// them and for at least d. Allocate's latency is compared with it,
// measured in the same run over as long: a tail percentile describes the
// span it was taken over (a disk's hiccups come every few seconds), so
// the floor's p99 over a tenth of a second is not comparable with
// Allocate's over five.
func (r *runner) fsyncFloor(n int, d time.Duration) (Dist, error) {
	dir := app.DevicePluginsDir(r.root)
	f, err := os.CreateTemp(dir, ".bench-fsync-")
	if err != nil {
		return Dist{}, err
	}
	defer func() {
		_ = f.Close()
		_ = os.Remove(f.Name())
	}()
	record := make([]byte, 256)
	samples := make([]time.Duration, 0, n)
	for end := time.Now().Add(d); len(samples) < n || time.Now().Before(end); {
		t0 := time.Now()
		if _, err := f.Write(record); err != nil {
			return Dist{}, err
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return Dist{}, fmt.Errorf("fdatasync %s: %w", f.Name(), err)
		}
		samples = append(samples, time.Since(t0))
	}
	return NewDist(samples), nil
}
