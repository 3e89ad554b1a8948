package bench

import (
	"testing"
	"time"
)

func TestNewDist(t *testing.T) {
	var s []time.Duration
	for i := 100; i >= 1; i-- {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	d := NewDist(s)
	if d.Count != 100 || d.P50 != 50 || d.P90 != 90 || d.P99 != 99 || d.Max != 100 {
		t.Fatalf("NewDist = %+v", d)
	}
	if (NewDist(nil) != Dist{}) {
		t.Fatal("empty samples must give a zero Dist")
	}
}
