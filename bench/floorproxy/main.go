// Command floorproxy is the least a Go HTTP proxy can be: the standard
// library's httputil.ReverseProxy, flushing at once, nothing else. It
// is the floor bench/latency.sh measures the gateways against: what any
// Go proxy adds on the machine at hand (the extra hop through the kernel,
// the extra wake-ups across CPUs, net/http on both sides), so that what
// reverse_proxy and llm_failover add beyond it is theirs.
//
//	go run ./bench/floorproxy -listen 127.0.0.1:18188 -upstream http://127.0.0.1:18190
package main

import (
	"flag"
	"io"
	"log"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18188", "address to listen on")
	upstream := flag.String("upstream", "http://127.0.0.1:18190", "where to send every request")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil {
		log.Fatal(err)
	}
	p := httputil.NewSingleHostReverseProxy(u)
	p.FlushInterval = -1
	p.ErrorLog = log.New(io.Discard, "", 0)
	// net/http's defaults but for idle connections per host (2), which
	// would make a proxy at thousands of requests a second dial most of
	// them: Caddy's reverse_proxy keeps 32.
	p.Transport = &http.Transport{MaxIdleConnsPerHost: 1024, IdleConnTimeout: 90 * time.Second}
	srv := &http.Server{Addr: *listen, Handler: p, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
