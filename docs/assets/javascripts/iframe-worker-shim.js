/* A stand-in for Web Workers when a page is opened from file://.
 *
 * Browsers refuse `new Worker(...)` for file:// pages, and Material's search runs in a worker.
 * Material's offline plugin would load a shim for this from a CDN; the smearcli site loads
 * nothing from the network, so this file (written for smearcli) does the same job locally: the
 * worker script runs in a hidden iframe, and messages travel with window.postMessage. The file
 * name contains "iframe-worker" so that the offline plugin sees a shim is present.
 */
(function () {
  "use strict";
  if (location.protocol !== "file:" || typeof EventTarget !== "function") return;

  // Installed inside the iframe before the worker script: the worker-side globals.
  function frameGlobals() {
    window.postMessage = function (data) { parent.postMessage(data, "*"); };
    window.importScripts = function () {
      var urls = Array.prototype.slice.call(arguments);
      return urls.reduce(function (done, url) {
        return done.then(function () {
          return new Promise(function (resolve, reject) {
            var s = document.createElement("script");
            s.src = url;
            s.onload = resolve;
            s.onerror = reject;
            document.body.appendChild(s);
          });
        });
      }, Promise.resolve());
    };
  }

  function FrameWorker(url) {
    var target = new EventTarget();
    var frame = document.createElement("iframe");
    frame.hidden = true;
    document.body.appendChild(frame);
    var win = frame.contentWindow;
    var ready = new Promise(function (resolve, reject) {
      frame.addEventListener("load", resolve);
      frame.addEventListener("error", reject);
    });
    function onMessage(event) {
      if (event.source !== win) return;
      var message = new MessageEvent("message", { data: event.data });
      target.dispatchEvent(message);
      if (typeof target.onmessage === "function") target.onmessage(message);
    }
    window.addEventListener("message", onMessage);
    win.document.open();
    win.document.write(
      "<!doctype html><html><body><script>(" + frameGlobals.toString() + ")();<\/script>" +
      "<script src=\"" + String(url).replace(/"/g, "&quot;") + "\"><\/script></body></html>");
    win.document.close();

    target.postMessage = function (data) {
      ready.then(function () {
        win.dispatchEvent(new MessageEvent("message", { data: data }));
      });
    };
    target.terminate = function () {
      window.removeEventListener("message", onMessage);
      frame.remove();
    };
    target.onmessage = null;
    target.onerror = null;
    return target;
  }

  window.Worker = FrameWorker;
})();
