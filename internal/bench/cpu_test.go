package bench

import (
	"fmt"
	"os/exec"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// TestCPUClockOfAnotherProcess: the bench reads a service's CPU time from
// its process CPU clock, in nanoseconds, and the figure agrees with the
// kernel's tick count in /proc/<pid>/stat, read before and after it.
func TestCPUClockOfAnotherProcess(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to run a busy process")
	}
	cmd := exec.Command(sh, "-c", "while :; do :; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid

	const tick = 0.01 // USER_HZ
	testutil.Eventually(t, "the busy process's CPU clock past 50 ms, within the ticks read around it", func() error {
		before, err := cpuTicks(pid)
		if err != nil {
			return err
		}
		v, err := cpuClock(pid)
		if err != nil {
			return err
		}
		after, err := cpuTicks(pid)
		if err != nil {
			return err
		}
		if v < 0.05 {
			return fmt.Errorf("CPU clock %.4f s", v)
		}
		// The kernel scales utime+stime to the scheduler's count, so the
		// clock lies between the two tick readings, give or take the
		// ticks' truncation.
		if v < before-2*tick || v > after+2*tick {
			return fmt.Errorf("CPU clock %.4f s, ticks %.2f s before and %.2f s after", v, before, after)
		}
		got, err := cpuSeconds(pid)
		if err != nil || got < v {
			return fmt.Errorf("cpuSeconds %.4f s (%v) after the clock read %.4f s", got, err, v)
		}
		return nil
	})
}

// A process that is gone has no CPU clock: cpuSeconds fails rather than
// saying zero.
func TestCPUClockOfProcessGone(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skip("cannot run true:", err)
	}
	if v, err := cpuSeconds(cmd.Process.Pid); err == nil {
		t.Fatalf("cpuSeconds of a reaped process: %.4f s, no error", v)
	}
}
