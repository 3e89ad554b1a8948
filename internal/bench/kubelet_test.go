package bench

import (
	"strings"
	"testing"
)

// TestKubeletFigures: the kubelet's ratios are nodeplug over the kubelet,
// medians over the rounds that ran it, named by kind and N; the section
// shows each figure's median, and nothing when the kubelet did not run.
func TestKubeletFigures(t *testing.T) {
	fig := func(p50, p99, total float64) RoundFigures {
		return RoundFigures{Notify: Dist{P50: p50, P99: p99}, TotalMs: total}
	}
	k1, k2, k3 := fig(500, 600, 610), fig(400, 500, 520), fig(450, 700, 700)
	res := FloorResult{Kind: KindDevicePlugin, N: 1000, Rounds: []FloorRound{
		{Nodeplug: fig(10, 60, 61), Kubelet: &k1},
		{Nodeplug: fig(10, 50, 52), Kubelet: &k2},
		{Nodeplug: fig(10, 140, 140), Kubelet: &k3},
	}}
	setKubeletRatios(&res)
	if res.KubeletRatioTotal != 0.1 || res.KubeletRatioP99 != 0.1 {
		t.Fatalf("ratios total %v, p99 %v; want 0.1, 0.1", res.KubeletRatioTotal, res.KubeletRatioP99)
	}
	// Below 100 plugins the kubelet's ratios are not compared.
	r := &Results{Floor: []FloorResult{res, {Kind: KindDRA, N: 10, Rounds: []FloorRound{{}}, KubeletRatioTotal: 0.02, KubeletRatioP99: 0.02}}}
	got := ComputeRatios(r)
	if len(got) != 2 || got["kubelet/device-plugin/n=1000/total"] != 0.1 || got["kubelet/device-plugin/n=1000/p99"] != 0.1 {
		t.Fatalf("ComputeRatios = %v; want the kubelet's two at N=1000 only", got)
	}
	var b strings.Builder
	PrintKubelet(&b, r)
	out := b.String()
	for _, want := range []string{"Registration against the kubelet's plugin manager", "device plugin N=1000",
		"kubelet p50   450.0  p99   600.0  total   610.0 ms", "nodeplug p50    10.0  p99    60.0  total    61.0 ms", "p99 0.10×  total 0.10×"} {
		if !strings.Contains(out, want) {
			t.Errorf("the section lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "N=10 ") {
		t.Errorf("a kind the kubelet did not run is shown:\n%s", out)
	}
	b.Reset()
	PrintKubelet(&b, &Results{Floor: []FloorResult{{Kind: KindDRA, N: 1, Rounds: []FloorRound{{}}}}})
	if b.Len() != 0 {
		t.Errorf("a section without the kubelet: %q", b.String())
	}
}
