(function(){
function key(c,num){var v=c?(c.getAttribute("data-v")!==null?c.getAttribute("data-v"):c.textContent.trim()):"";
if(!num)return v.toLowerCase();var f=parseFloat(v);return isNaN(f)?-Infinity:f;}
function sort(th){var t=th.closest("table"),b=t.tBodies[0],i=th.cellIndex,num=th.classList.contains("num");
var d=th.getAttribute("aria-sort")==="ascending"?"descending":"ascending",s=d==="ascending"?1:-1;
t.querySelectorAll("thead th").forEach(function(h){h.removeAttribute("aria-sort");});th.setAttribute("aria-sort",d);
var rows=Array.prototype.map.call(b.rows,function(r,n){return [r,key(r.cells[i],num),n];});
rows.sort(function(x,y){return x[1]<y[1]?-s:x[1]>y[1]?s:x[2]-y[2];});rows.forEach(function(r){b.appendChild(r[0]);});}
function filter(t,text){text=text.toLowerCase();var n=0;Array.prototype.forEach.call(t.tBodies[0].rows,function(r){
r.hidden=text!==""&&r.textContent.toLowerCase().indexOf(text)<0;if(!r.hidden)n++;});t.setAttribute("data-shown",n);}
document.querySelectorAll("table.sortable thead th").forEach(function(th){th.tabIndex=0;
th.addEventListener("click",function(){sort(th);});
th.addEventListener("keydown",function(e){if(e.key==="Enter")sort(th);});});
document.querySelectorAll("input.filter").forEach(function(f){
var t=document.getElementById(f.getAttribute("data-table"));if(!t)return;f.hidden=false;
f.addEventListener("input",function(){filter(t,f.value);});});
var p=new URLSearchParams(location.search);
p.getAll("sort").forEach(function(v){var a=v.split(":"),t=document.getElementById(a[0]);if(!t)return;
var th=t.querySelector('thead th[data-col="'+(a[1]||"").replace(/["\\]/g,"")+'"]');if(!th)return;
sort(th);if(a[2]==="desc")sort(th);});
p.getAll("q").forEach(function(v){var k=v.indexOf(":"),id=v.slice(0,k),t=document.getElementById(id),
f=document.querySelector('input.filter[data-table="'+id.replace(/["\\]/g,"")+'"]');if(!t||!f)return;
f.value=v.slice(k+1);filter(t,f.value);});
})();