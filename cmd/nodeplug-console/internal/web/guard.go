package web

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// CookieName is the cookie that carries the token after the first visit.
const CookieName = "nodeplug_console"

// NewToken returns a random token: 32 bytes, hex.
func NewToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand's contract)
	return hex.EncodeToString(b)
}

// Guard lets a request through only when
//   - its Host header names a loopback address, "localhost" (or a name
//     under .localhost), the listen address's host, or one of the extra
//     allowed hosts — a page of another site whose name an attacker points
//     at 127.0.0.1 (DNS rebinding) sends its own name and is refused (403);
//   - its method is GET or HEAD — the console changes nothing (405);
//   - it carries the token: in the cookie, as "Authorization: Bearer", or as
//     ?token= (401 otherwise). A page visit with ?token= sets the cookie
//     (HttpOnly, SameSite=Strict) and is redirected to the same URL without
//     the token, so it stays out of the history and of Referer headers.
type Guard struct {
	token   string
	allowed map[string]bool
}

// NewGuard returns a guard for token. listenHost is the host of the listen
// address; extra are further allowed host names.
func NewGuard(token, listenHost string, extra []string) *Guard {
	g := &Guard{token: token, allowed: map[string]bool{"localhost": true}}
	if ip := net.ParseIP(listenHost); listenHost != "" && (ip == nil || !ip.IsUnspecified()) {
		g.allowed[strings.ToLower(listenHost)] = true
	}
	for _, h := range extra {
		g.allowed[strings.ToLower(strings.Trim(h, "[]"))] = true
	}
	return g
}

// HostAllowed reports whether a Host header value passes the DNS-rebinding
// check.
func (g *Guard) HostAllowed(hostHeader string) bool {
	host := hostHeader
	if h, _, err := net.SplitHostPort(hostHeader); err == nil {
		host = h
	}
	host = strings.ToLower(strings.Trim(host, "[]"))
	if host == "" {
		return false
	}
	if g.allowed[host] || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// TokenOK reports whether r carries the token.
func (g *Guard) TokenOK(r *http.Request) bool {
	if c, err := r.Cookie(CookieName); err == nil && g.equal(c.Value) {
		return true
	}
	if a, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && g.equal(a) {
		return true
	}
	return g.equal(r.URL.Query().Get("token"))
}

func (g *Guard) equal(s string) bool {
	return s != "" && subtle.ConstantTimeCompare([]byte(s), []byte(g.token)) == 1
}

// Wrap returns next behind the guard's checks.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w.Header())
		if !g.HostAllowed(r.Host) {
			http.Error(w, "refused: the Host header "+quote(r.Host)+" is not a loopback name or address (open the console by the URL it printed)", http.StatusForbidden)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method "+r.Method+" not allowed: the console only reads", http.StatusMethodNotAllowed)
			return
		}
		if !g.TokenOK(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="nodeplug-console"`)
			http.Error(w, "unauthorized: open the console by the URL with ?token= that nodeplug-console printed at start", http.StatusUnauthorized)
			return
		}
		q := r.URL.Query()
		if q.Has("token") {
			http.SetCookie(w, &http.Cookie{Name: CookieName, Value: g.token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			q.Del("token")
			u := url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
			http.Redirect(w, r, u.String(), http.StatusSeeOther)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

func quote(s string) string {
	if len(s) > 100 {
		s = s[:100] + "…"
	}
	return `"` + strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return '?'
		}
		return r
	}, s) + `"`
}
