package chaos

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The devicemanager's checkpoint is a snapshot and a journal beside it
// (services/internal/store): nodeplug_checkpoint and
// nodeplug_checkpoint.journal.<N>. A journal is a sequence of frames, a
// 12-byte header whose first four bytes are the payload's length (little
// endian) and then the payload; the first frame is the file's own header.
// The harness reads that much of the format to damage journals where it
// means to.

const (
	journalInfix = ".journal."
	frameHeader  = 12
)

// journals returns the journal files, by number.
func (h *harness) journals() []string {
	entries, err := os.ReadDir(filepath.Dir(h.checkpoint()))
	if err != nil {
		return nil
	}
	prefix := filepath.Base(h.checkpoint()) + journalInfix
	type numbered struct {
		n    uint64
		path string
	}
	var js []numbered
	for _, e := range entries {
		digits, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(digits, 10, 64)
		if err != nil {
			continue
		}
		js = append(js, numbered{n, filepath.Join(filepath.Dir(h.checkpoint()), e.Name())})
	}
	for i := 1; i < len(js); i++ {
		for k := i; k > 0 && js[k].n < js[k-1].n; k-- {
			js[k], js[k-1] = js[k-1], js[k]
		}
	}
	out := make([]string, len(js))
	for i, j := range js {
		out[i] = j.path
	}
	return out
}

// compacting says whether the checkpoint directory shows a compaction in
// progress: two journals, or a temporary file being written.
func (h *harness) compacting() bool {
	if len(h.journals()) > 1 {
		return true
	}
	m, _ := filepath.Glob(filepath.Join(filepath.Dir(h.checkpoint()), ".nodeplug_checkpoint.*tmp-*"))
	return len(m) > 0
}

// frames returns the start offset and total length of each complete frame
// of a journal's bytes, up to the zeros that pad a journal after its
// records.
func frames(b []byte) [][2]int {
	var out [][2]int
	for off := 0; off+frameHeader <= len(b); {
		n := int(binary.LittleEndian.Uint32(b[off:]))
		if n == 0 || off+frameHeader+n > len(b) {
			break
		}
		out = append(out, [2]int{off, frameHeader + n})
		off += frameHeader + n
	}
	return out
}

// compactionKills runs Allocate/Release clients and SIGKILLs the
// devicemanager as soon as it is seen compacting its checkpoint; each
// time the restarted devicemanager must find its files valid (no loud
// log, nothing moved aside) and list every acknowledged allocation.
func (h *harness) compactionKills(ctx context.Context) error {
	if h.cfg.CompactionKills == 0 {
		return nil
	}
	h.logf("compaction kills: %d devicemanager kills during a checkpoint compaction", h.cfg.CompactionKills)
	h.mu.Lock()
	h.res.CompactionAimed = h.cfg.CompactionKills
	h.mu.Unlock()
	mid := func() int {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.res.MidCompaction
	}
	landed := 0
	// A compaction can end between being seen and the kill: such a kill
	// is tried again, up to three times as many attempts as kills aimed.
	for i := 0; landed < h.cfg.CompactionKills && i < 3*h.cfg.CompactionKills; i++ {
		mid0 := mid()
		err := h.killUnderLoad(ctx, fmt.Sprintf("compaction kill %d", i+1),
			func(cctx context.Context, c int, named func(string)) {
				rs := h.stableResources()
				for k := 0; cctx.Err() == nil; k++ {
					pod := fmt.Sprintf("compact-%d-%d-%d", i, c, k)
					named(pod)
					holds, err := h.allocate(cctx, pod, rs[h.intn(len(rs))], 1)
					if err != nil && !definite(err) {
						return // the devicemanager is gone
					}
					if holds && !h.release(cctx, pod) {
						return
					}
				}
			},
			func(<-chan struct{}) error {
				deadline := time.Now().Add(h.cfg.Converge)
				for !h.compacting() && time.Now().Before(deadline) && ctx.Err() == nil {
					time.Sleep(200 * time.Microsecond)
				}
				return ctx.Err()
			},
			func() {
				h.mu.Lock()
				h.res.CompactionKills++
				h.mu.Unlock()
			})
		if err != nil {
			return err
		}
		if mid() > mid0 {
			landed++
		}
	}
	h.mu.Lock()
	h.res.CompactionLanded = landed
	h.mu.Unlock()
	h.logf("  %d of %d kills landed during a compaction (%d aimed)", landed, h.res.CompactionKills, h.cfg.CompactionKills)
	_, err := h.converge(ctx, "end of compaction kills", "")
	return err
}
