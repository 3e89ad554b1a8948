package bench

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/pkg/app"
)

// overwriteFloorBytes is the size of the overwrite floor's file: as large
// as a new journal (store.preallocation of the default compaction size),
// written over again from its start when the records reach its end.
const overwriteFloorBytes = 1<<20 + 1<<18

// fsyncFloors measures the least that making one change durable can cost
// on the checkpoint's filesystem, two ways, each a small record followed
// by fdatasync in a file of the device-plugins directory:
//
//   - append: the record grows the file, so fdatasync also commits its new
//     size (the floor the Allocate target is set against);
//   - overwrite: the record goes over zeros written and synced
//     beforehand, so fdatasync commits no metadata: what the journal pays,
//     as it is preallocated.
//
// The two alternate, one sample each in turn, at least n of each and for
// at least d, so that both see the same moments of the disk. Allocate's
// latency is compared with them, measured in the same run over as long: a
// tail percentile describes the span it was taken over (a disk's hiccups
// come every few seconds), so the floor's p99 over a tenth of a second is
// not comparable with Allocate's over five.
func (r *runner) fsyncFloors(n int, d time.Duration) (appendFloor, overwriteFloor Dist, err error) {
	dir := app.DevicePluginsDir(r.root)
	var files []*os.File
	defer func() {
		for _, f := range files {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	for range 2 {
		f, err := os.CreateTemp(dir, ".bench-fsync-")
		if err != nil {
			return Dist{}, Dist{}, err
		}
		files = append(files, f)
	}
	af, of := files[0], files[1]
	if _, err := of.Write(make([]byte, overwriteFloorBytes)); err != nil {
		return Dist{}, Dist{}, err
	}
	if err := of.Sync(); err != nil {
		return Dist{}, Dist{}, fmt.Errorf("fsync %s: %w", of.Name(), err)
	}
	record := make([]byte, 256)
	for i := range record {
		record[i] = 'x'
	}
	sync := func(f *os.File) error {
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return fmt.Errorf("fdatasync %s: %w", f.Name(), err)
		}
		return nil
	}
	appends := make([]time.Duration, 0, n)
	overwrites := make([]time.Duration, 0, n)
	var off int64
	for end := time.Now().Add(d); len(appends) < n || time.Now().Before(end); {
		t0 := time.Now()
		if _, err := af.Write(record); err != nil {
			return Dist{}, Dist{}, err
		}
		if err := sync(af); err != nil {
			return Dist{}, Dist{}, err
		}
		appends = append(appends, time.Since(t0))

		if off+int64(len(record)) > overwriteFloorBytes {
			off = 0
		}
		t0 = time.Now()
		if _, err := of.WriteAt(record, off); err != nil {
			return Dist{}, Dist{}, err
		}
		if err := sync(of); err != nil {
			return Dist{}, Dist{}, err
		}
		overwrites = append(overwrites, time.Since(t0))
		off += int64(len(record))
	}
	return NewDist(appends), NewDist(overwrites), nil
}
