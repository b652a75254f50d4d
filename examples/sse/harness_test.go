package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestBrowserHarness checks the WebDriver harness itself against a static
// page, independently of listenhub: two tabs, DOM changes made by scripts
// after the page load, and polling until they show.
func TestBrowserHarness(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><title>h</title><ul id="items"></ul><script>
const q = new URLSearchParams(location.search).get("q");
let n = 0;
const id = setInterval(() => {
  const li = document.createElement("li");
  li.textContent = q + "-" + (++n);
  document.getElementById("items").append(li);
  if (n === 3) clearInterval(id);
}, 20);
</script>`)
	}))
	defer srv.Close()

	b := startBrowser(t)
	a := b.firstTab()
	a.open(srv.URL + "/?q=a")
	c := b.newTab()
	c.open(srv.URL + "/?q=c")
	a.waitTexts(10*time.Second, "#items li", []string{"a-1", "a-2", "a-3"})
	c.waitTexts(10*time.Second, "#items li", []string{"c-1", "c-2", "c-3"})

	var title string
	a.eval(&title, `return document.title;`)
	if title != "h" {
		t.Fatalf("title %q", title)
	}
}
