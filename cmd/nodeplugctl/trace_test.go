package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

// consoleServer answers GET /api/traces/<id> as nodeplug-console does:
// Jaeger's JSON, only with the bearer token.
func consoleServer(t *testing.T, token string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		switch r.URL.Path {
		case "/api/traces/0af7651916cd43dd8448eb211c80319c":
			fmt.Fprint(w, jaegerFixture)
		default:
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"data":[],"errors":[{"code":404,"msg":"trace not found"}]}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// writeConsoleInfo leaves the console's info file under root, as
// nodeplug-console does at start.
func writeConsoleInfo(t *testing.T, root, url, token string) {
	t.Helper()
	path := layout.ConsoleInfoFile(root)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(map[string]any{"url": url, "token": token, "otlp": "127.0.0.1:4317", "pid": 1})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// noJaegerEnv makes --jaeger-url its default, as in a user's shell.
func noJaegerEnv(t *testing.T) {
	t.Setenv("NODEPLUG_CTL_JAEGER_URL", "")
	os.Unsetenv("NODEPLUG_CTL_JAEGER_URL")
}

// TestTraceFromConsole: under make run the console holds the traces;
// nodeplugctl trace finds its URL and token under the root dir and draws
// the same waterfall as from Jaeger.
func TestTraceFromConsole(t *testing.T) {
	noJaegerEnv(t)
	root := testutil.TempDir(t)
	token := strings.Repeat("ab", 32)
	srv := consoleServer(t, token)
	writeConsoleInfo(t, root, srv.URL, token)

	code, out, errOut := runCLI(t, "--root-dir", root, "trace", "--width", "20", "0af7651916cd43dd8448eb211c80319c")
	if code != exitOK || out != waterfallWant {
		t.Fatalf("exit %d, stderr %q, output:\n%s\nwant:\n%s", code, errOut, out, waterfallWant)
	}
	code, _, errOut = runCLI(t, "--root-dir", root, "trace", "00000000000000000000000000000001")
	if code != exitError || !strings.Contains(errOut, "not found in the console at "+srv.URL) {
		t.Errorf("a trace the console does not hold: exit %d, stderr %q", code, errOut)
	}

	// A console restarted since (a new token): said so.
	writeConsoleInfo(t, root, srv.URL, strings.Repeat("cd", 32))
	code, _, errOut = runCLI(t, "--root-dir", root, "trace", "0af7651916cd43dd8448eb211c80319c")
	if code != exitError || !strings.Contains(errOut, "refused the token") {
		t.Errorf("a stale token: exit %d, stderr %q", code, errOut)
	}

	// A console that is gone: its file left behind, nothing listening.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + lis.Addr().String()
	lis.Close()
	writeConsoleInfo(t, root, gone, token)
	code, _, errOut = runCLI(t, "--root-dir", root, "trace", "0af7651916cd43dd8448eb211c80319c")
	if code != exitError || !strings.Contains(errOut, "cannot reach the console at "+gone) || !strings.Contains(errOut, "make run starts it") {
		t.Errorf("a console that is gone: exit %d, stderr %q", code, errOut)
	}
}

// TestTraceSourceChoice: --jaeger-url, or --source jaeger, reads Jaeger
// even beside a console; --source console without one says how to start
// it; without either, the Jaeger error names both ways to get traces
// rather than only make up.
func TestTraceSourceChoice(t *testing.T) {
	noJaegerEnv(t)
	root := testutil.TempDir(t)
	jaegerHits := 0
	jaeger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		jaegerHits++
		fmt.Fprint(w, jaegerFixture)
	}))
	defer jaeger.Close()
	token := strings.Repeat("ef", 32)
	console := consoleServer(t, token)
	writeConsoleInfo(t, root, console.URL, token)

	for _, args := range [][]string{
		{"--root-dir", root, "--jaeger-url", jaeger.URL, "trace", "0af7651916cd43dd8448eb211c80319c"},
		{"--root-dir", root, "trace", "--source", "jaeger", "--jaeger-url", jaeger.URL, "0af7651916cd43dd8448eb211c80319c"},
	} {
		before := jaegerHits
		if code, _, errOut := runCLI(t, args...); code != exitOK || jaegerHits != before+1 {
			t.Errorf("%q: exit %d, stderr %q, Jaeger asked %d times; want Jaeger asked once", args, code, errOut, jaegerHits-before)
		}
	}

	empty := testutil.TempDir(t)
	code, _, errOut := runCLI(t, "--root-dir", empty, "trace", "--source", "console", "0af7651916cd43dd8448eb211c80319c")
	if code != exitError || !strings.Contains(errOut, "make run starts it") {
		t.Errorf("--source console without a console: exit %d, stderr %q", code, errOut)
	}
	code, _, errOut = runCLI(t, "--root-dir", empty, "trace", "--source", "elsewhere", "0af7651916cd43dd8448eb211c80319c")
	if code != exitUsage || !strings.Contains(errOut, "want auto, console or jaeger") {
		t.Errorf("--source elsewhere: exit %d, stderr %q", code, errOut)
	}

	// No console file and no Jaeger: the error says where traces come
	// from under make run as well as under make up.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + lis.Addr().String()
	lis.Close()
	code, _, errOut = runCLI(t, "--root-dir", empty, "--jaeger-url", closed, "trace", "0af7651916cd43dd8448eb211c80319c")
	if code != exitError || !strings.Contains(errOut, "cannot reach Jaeger at "+closed) ||
		!strings.Contains(errOut, "under make run the console holds the traces") || !strings.Contains(errOut, layout.ConsoleInfoFile(empty)) {
		t.Errorf("no trace source: exit %d, stderr %q", code, errOut)
	}
}
