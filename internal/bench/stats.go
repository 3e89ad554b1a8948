// Package bench measures nodeplug as its users see it: real service
// processes, real plugins on real Unix sockets. cmd/nodeplug-bench prints its
// figures; `make test` runs it in short mode as a test of the bench itself.
package bench

import (
	"fmt"
	"math"
	"sort"
	"time"
)

// Dist is a latency distribution in milliseconds.
type Dist struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// NewDist summarizes samples.
func NewDist(samples []time.Duration) Dist {
	if len(samples) == 0 {
		return Dist{}
	}
	s := append([]time.Duration(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(s)))) - 1
		if i < 0 {
			i = 0
		}
		return ms(s[i])
	}
	return Dist{Count: len(s), P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: ms(s[len(s)-1])}
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

func (d Dist) String() string {
	return fmt.Sprintf("n=%-5d p50 %8.3f  p90 %8.3f  p99 %8.3f  max %8.3f ms", d.Count, d.P50, d.P90, d.P99, d.Max)
}
