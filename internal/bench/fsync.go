package bench

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/pkg/app"
)

// fsyncFloor measures the least that making one change durable can cost
// on the checkpoint's filesystem: n appends of a small record to a file in
// the device-plugins directory, each followed by fdatasync. Allocate's
// latency is compared with it, measured in the same run.
func (r *runner) fsyncFloor(n int) (Dist, error) {
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
	for range n {
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
