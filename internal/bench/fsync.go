package bench

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/pkg/layout"
)

// overwriteFloorBytes is the size of the overwrite floor's file: as large
// as a new journal (store.preallocation of the default compaction size),
// written over again from its start when the records reach its end.
const overwriteFloorBytes = 1<<20 + 1<<18

// pacedFloorPause is the pause after each write of the paced floor: about
// the time between two of the devicemanager's writes for one caller, one
// RPC round trip to the plugin and one to the caller.
const pacedFloorPause = 500 * time.Microsecond

// floors are the fsync floors of one run (see fsyncFloors).
type floors struct {
	append, overwrite, paced Dist
}

// fsyncFloors measures the least that making one change durable can cost
// on the checkpoint's filesystem, three ways, each a small record followed
// by fdatasync in a file of the device-plugins directory:
//
//   - append: the record grows the file, so fdatasync also commits its new
//     size (the floor the Allocate target is set against);
//   - overwrite: the record goes over zeros written and synced
//     beforehand, so fdatasync commits no metadata: what the journal pays,
//     as it is preallocated;
//   - paced: appends again, each followed by a pause of pacedFloorPause, as
//     a service's writes come when it is not writing back to back. On a
//     virtual machine an idle CPU sleeps and waking it takes time, so
//     the same fdatasync costs more when nothing keeps the CPU busy
//     between writes; back to back, the disk and the CPU stay awake.
//
// Append and overwrite alternate, one sample each in turn, at least n of
// each and for at least d, so that both see the same moments of the disk;
// the paced appends follow, as many and for as long. Allocate's latency is
// compared with them, measured in the same run over as long: a tail
// percentile describes the span it was taken over (a disk's hiccups come
// every few seconds), so the floor's p99 over a tenth of a second is not
// comparable with Allocate's over five.
func (r *runner) fsyncFloors(n int, d time.Duration) (floors, error) {
	dir := layout.DevicePluginsDir(r.root)
	var files []*os.File
	defer func() {
		for _, f := range files {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	for range 3 {
		f, err := os.CreateTemp(dir, ".bench-fsync-")
		if err != nil {
			return floors{}, err
		}
		files = append(files, f)
	}
	af, of, pf := files[0], files[1], files[2]
	if _, err := of.Write(make([]byte, overwriteFloorBytes)); err != nil {
		return floors{}, err
	}
	if err := of.Sync(); err != nil {
		return floors{}, fmt.Errorf("fsync %s: %w", of.Name(), err)
	}
	record := make([]byte, 256)
	for i := range record {
		record[i] = 'x'
	}
	// write writes the record at off (off < 0: at the end) and syncs it.
	write := func(f *os.File, off int64) (time.Duration, error) {
		t0 := time.Now()
		var err error
		if off < 0 {
			_, err = f.Write(record)
		} else {
			_, err = f.WriteAt(record, off)
		}
		if err != nil {
			return 0, err
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return 0, fmt.Errorf("fdatasync %s: %w", f.Name(), err)
		}
		return time.Since(t0), nil
	}
	appends := make([]time.Duration, 0, n)
	overwrites := make([]time.Duration, 0, n)
	var off int64
	for end := time.Now().Add(d); len(appends) < n || time.Now().Before(end); {
		t, err := write(af, -1)
		if err != nil {
			return floors{}, err
		}
		appends = append(appends, t)
		if off+int64(len(record)) > overwriteFloorBytes {
			off = 0
		}
		if t, err = write(of, off); err != nil {
			return floors{}, err
		}
		overwrites = append(overwrites, t)
		off += int64(len(record))
	}
	paced := make([]time.Duration, 0, n)
	for end := time.Now().Add(d); len(paced) < n || time.Now().Before(end); {
		t, err := write(pf, -1)
		if err != nil {
			return floors{}, err
		}
		paced = append(paced, t)
		time.Sleep(pacedFloorPause)
	}
	return floors{append: NewDist(appends), overwrite: NewDist(overwrites), paced: NewDist(paced)}, nil
}
