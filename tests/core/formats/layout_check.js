// Measures report.html's text boxes after layout and writes the findings into the page as
// <pre id="layout-check">JSON</pre> (read back through chromium --dump-dom).
(function () {
  const problems = [];
  const root = document.documentElement;
  const width = root.clientWidth, height = window.innerHeight;
  if (root.scrollWidth > width + 1) problems.push(`page ${root.scrollWidth} px wide in a ${width} px window`);
  const charts = document.querySelectorAll('figure.chart svg');
  for (const svg of charts) {
    const box = svg.viewBox.baseVal;
    for (const text of svg.querySelectorAll('text')) {
      const b = text.getBBox();
      if (b.x < box.x - 0.5 || b.y < box.y - 0.5 || b.x + b.width > box.x + box.width + 0.5 ||
          b.y + b.height > box.y + box.height + 0.5) {
        problems.push(`chart text "${text.textContent}" at [${b.x.toFixed(1)}, ${b.y.toFixed(1)}, ` +
                      `${b.width.toFixed(1)} x ${b.height.toFixed(1)}] outside its ${box.width} x ${box.height} chart`);
      }
    }
    const shown = svg.getBoundingClientRect().width;
    if (shown < 300) problems.push(`a chart is ${shown.toFixed(0)} px wide (< 300)`);
  }
  for (const e of document.querySelectorAll('h1, h2, h3, p, figcaption, li, td, th, summary')) {
    if (e.closest('.scroll') && (e.tagName === 'TD' || e.tagName === 'TH')) continue;  // scrolls
    if (e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1 && e.tagName !== 'SUMMARY') {
      problems.push(`${e.tagName.toLowerCase()} "${e.textContent.slice(0, 60)}" overflows its box ` +
                    `(${e.scrollWidth} x ${e.scrollHeight} in ${e.clientWidth} x ${e.clientHeight})`);
    }
  }
  const summary = document.querySelector('.summary');
  const summaryTop = summary ? summary.getBoundingClientRect().top : -1;
  if (!summary || summaryTop > height) problems.push(`summary not on the first screen (top ${summaryTop})`);
  const out = document.createElement('pre');
  out.id = 'layout-check';
  out.textContent = JSON.stringify({width, height, charts: charts.length, summaryTop, problems});
  document.body.appendChild(out);
})();
