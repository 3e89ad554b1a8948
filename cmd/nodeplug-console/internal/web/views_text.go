package web

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// How the views show long values: paths relative to the root dir, socket
// generations as when the socket was made, gRPC method names with their
// package apart, each with the whole value to hover over.

// pathText is a path as a view shows it: Short is relative to the root dir
// when the path is beneath it, Full the path as the services gave it.
type pathText struct{ Full, Short string }

func relPath(root, p string) pathText {
	t := pathText{Full: p, Short: p}
	if root == "" || !filepath.IsAbs(p) {
		return t
	}
	if rel, err := filepath.Rel(root, p); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
		t.Short = rel
	}
	return t
}

// genText is a socket generation as a view shows it: Label says when the
// socket file was made (or last modified, on a filesystem without birth
// times), Title says it all, Full is the generation itself.
type genText struct{ Full, Label, Title string }

// generationOf reads a generation of pkg/unixsock ("<dev>:<ino>:b<ns>" or
// "<dev>:<ino>:m<ns>", numbers in hex but ns); another one is shown as it
// is.
func generationOf(g string) genText {
	t := genText{Full: g, Label: g, Title: "generation " + g}
	if g == "" {
		return t
	}
	parts := strings.Split(g, ":")
	if len(parts) != 3 || len(parts[2]) < 2 {
		return t
	}
	dev, err1 := strconv.ParseUint(parts[0], 16, 64)
	ino, err2 := strconv.ParseUint(parts[1], 16, 64)
	ns, err3 := strconv.ParseInt(parts[2][1:], 10, 64)
	verb := map[byte]string{'b': "created", 'm': "modified"}[parts[2][0]]
	if err1 != nil || err2 != nil || err3 != nil || verb == "" || ns <= 0 {
		return t
	}
	at := time.Unix(0, ns).UTC()
	t.Label = verb + " " + at.Format("15:04:05")
	t.Title = fmt.Sprintf("socket generation %s: inode %d on device %#x, %s %s UTC; a new generation means the socket file was made again",
		g, ino, dev, verb, at.Format("2006-01-02 15:04:05.000"))
	return t
}

// opText is an operation (span) name: a gRPC method's package apart from
// its service and method, so that a narrow column cuts the package first.
type opText struct{ Full, Package, Name string }

func opOf(name string) opText {
	t := opText{Full: name, Name: name}
	slash := strings.IndexByte(name, '/')
	if slash <= 0 || strings.ContainsAny(name, " ") {
		return t
	}
	if dot := strings.LastIndexByte(name[:slash], '.'); dot > 0 {
		t.Package, t.Name = name[:dot+1], name[dot+1:]
	}
	return t
}

// tick is one mark of a waterfall's time ruler: at Pos percent of the
// trace's duration (X of 0..1000 on the bars' axis), labelled, its label
// anchored at its start, middle or end so that it stays inside the ruler.
type tick struct {
	Pos, X        float64
	Label, Anchor string
}

// rulerOf returns the ruler's ticks for a trace of total µs: 0 and every
// step after it up to total, the step being 1, 2, 2.5 or 5 times a power
// of ten that makes four to ten of them.
func rulerOf(total int64) []tick {
	if total <= 0 {
		return []tick{{Pos: 0, X: 0, Label: "0ms", Anchor: "start"}}
	}
	step := niceStep(float64(total) / 6)
	var out []tick
	for k := 0; ; k++ {
		at := float64(k) * step
		if at > float64(total)+step*1e-9 {
			break
		}
		pos := math.Round(at/float64(total)*1000) / 10
		t := tick{Pos: pos, X: math.Round(at/float64(total)*10000) / 10, Label: tickLabel(at, step, total), Anchor: "middle"}
		switch {
		case k == 0:
			t.Anchor = "start"
		case pos > 94:
			t.Anchor = "end"
		}
		out = append(out, t)
	}
	return out
}

// niceStep returns the least of 1, 2, 2.5, 5 times a power of ten (at least
// 1 µs) that is not below raw.
func niceStep(raw float64) float64 {
	if raw <= 1 {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if s := m * mag; s >= raw*(1-1e-9) {
			return math.Max(1, s)
		}
	}
	return 10 * mag
}

// tickLabel writes at µs in milliseconds (in seconds for a trace of 10 s
// or more), with as many decimals as the step needs.
func tickLabel(at, step float64, total int64) string {
	unit, div := "ms", 1e3
	if total >= 10e6 {
		unit, div = "s", 1e6
	}
	if at == 0 {
		return "0" + unit
	}
	decimals := 0
	for s := step / div; decimals < 3 && math.Abs(s-math.Round(s)) > 1e-9; s *= 10 {
		decimals++
	}
	return strconv.FormatFloat(at/div, 'f', decimals, 64) + unit
}

// breakable cuts s after each '.', '/', '_', '-', ':' and ',' that has
// more after it: a page puts a line break opportunity (<wbr>) between the
// parts, so that a long name wraps where it has a joint rather than in the
// middle of a word.
func breakable(s string) []string {
	var out []string
	last := 0
	for i := 0; i < len(s)-1; i++ {
		if strings.IndexByte("./_-:,", s[i]) >= 0 {
			out = append(out, s[last:i+1])
			last = i + 1
		}
	}
	if last < len(s) {
		out = append(out, s[last:])
	}
	return out
}
